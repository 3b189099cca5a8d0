# The ATTNLAB_SENTENCEPIECE switch: the BPE tokenizer (`attnlab tokenize`, BPE token files) on
# SentencePiece's C++ library. AUTO builds it when pkg-config finds `sentencepiece` (Debian:
# libsentencepiece-dev), ON requires it, OFF leaves it out. Sets ATTNLAB_WITH_SENTENCEPIECE;
# attnlab_add_sentencepiece(target source) defines it on that one source and links the library.
set(ATTNLAB_WITH_SENTENCEPIECE OFF)
if(NOT ATTNLAB_SENTENCEPIECE STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(SentencePiece QUIET IMPORTED_TARGET sentencepiece)
  endif()
  if(SentencePiece_FOUND)
    set(ATTNLAB_WITH_SENTENCEPIECE ON)
  elseif(ATTNLAB_SENTENCEPIECE STREQUAL "ON")
    message(FATAL_ERROR "ATTNLAB_SENTENCEPIECE=ON but pkg-config found no sentencepiece: install "
                        "Debian's libsentencepiece-dev (.ci/deps.sh does), or configure with "
                        "-DATTNLAB_SENTENCEPIECE=OFF")
  endif()
endif()
message(STATUS "attnlab: ATTNLAB_SENTENCEPIECE=${ATTNLAB_SENTENCEPIECE}, "
               "SentencePiece support built: ${ATTNLAB_WITH_SENTENCEPIECE}")

function(attnlab_add_sentencepiece target source)
  if(ATTNLAB_WITH_SENTENCEPIECE)
    set_property(SOURCE "${source}" APPEND PROPERTY COMPILE_DEFINITIONS ATTNLAB_WITH_SENTENCEPIECE)
    target_link_libraries(${target} PRIVATE PkgConfig::SentencePiece)
  endif()
endfunction()
