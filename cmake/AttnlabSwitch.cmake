# attnlab_switch(NAME DOC): an AUTO|ON|OFF cache variable (default AUTO) for an optional part of the
# build, upper-cased in this scope; anything else is a configure error naming the variable.
macro(attnlab_switch name doc)
  set(${name} "AUTO" CACHE STRING "${doc}: AUTO, ON or OFF")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${name}}" ${name})
  if(NOT ${name} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${name}: expected AUTO, ON or OFF, got '${${name}}'")
  endif()
endmacro()
