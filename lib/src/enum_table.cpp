#include "attnlab/enum_table.hpp"

#include <stdexcept>

#include "attnlab/tensor.hpp"

namespace attnlab::enum_detail {

std::string join_names(std::span<const std::string_view> names, NameList list) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) {
      if (list == NameList::pipes)
        out += '|';
      else
        out += i + 1 == names.size() ? " or " : ", ";
    }
    if (list == NameList::quoted_or) out += '\'';
    out += names[i];
    if (list == NameList::quoted_or) out += '\'';
  }
  return out;
}

void refuse(const EnumParseText& how, std::span<const std::string_view> names,
            std::string_view text) {
  std::string message(how.op);
  message += ": ";
  if (!how.noun.empty()) message.append(how.noun).append(" ");
  message += "expected " + join_names(names, how.list) + ", got ";
  if (how.quoted) {
    std::string quoted = "'";
    quoted.append(text).append("'");
    message += shown_text(quoted, 200);
  } else {
    message += shown_text(text, 200);
  }
  throw std::invalid_argument(message);
}

std::string help_text(std::span<const std::string_view> names,
                      std::span<const std::string_view> helps) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += "; ";
    out += names[i];
    if (!helps[i].empty()) out.append(": ").append(helps[i]);
  }
  return out;
}

}  // namespace attnlab::enum_detail
