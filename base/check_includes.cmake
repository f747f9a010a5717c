# Fails naming every source under DIR that includes a header of a folder in
# FORBIDDEN (a ;-list of top-level folders: "proto;launcher"), so that base/
# and proto/ stay below the programs built on them.
#   cmake -DDIR=<folder> -DFORBIDDEN=<folders> -P check_includes.cmake
if(NOT DIR OR NOT FORBIDDEN)
  message(FATAL_ERROR "check_includes: -DDIR and -DFORBIDDEN are required")
endif()
list(JOIN FORBIDDEN "|" alternatives)
file(GLOB_RECURSE files RELATIVE ${DIR} ${DIR}/*.cc ${DIR}/*.h)
set(bad "")
foreach(f ${files})
  file(STRINGS ${DIR}/${f} includes
       REGEX "^[ \t]*#[ \t]*include[ \t]+\"(${alternatives})/")
  foreach(line ${includes})
    string(REGEX REPLACE ".*\"([^\"]+)\".*" "\\1" target "${line}")
    list(APPEND bad "${f} includes ${target}")
  endforeach()
endforeach()
if(bad)
  get_filename_component(folder ${DIR} NAME)
  list(JOIN bad "\n  ${folder}/" text)
  message(FATAL_ERROR "check_includes: ${folder}/ includes what is built on it:\n  ${folder}/${text}")
endif()
