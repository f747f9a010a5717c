# The launcher's layering rule: each source may include launcher headers of
# its own stage and of the stages before it, never of a later one.
#   cmake -DDIR=<launcher dir> -P check_layers.cmake
# Stages in order (a header at launcher/ itself: options.h is its own stage,
# the others belong to the top):
#   plan  options  start  state  report  supervise  top
# Fails naming every include that runs back up.
set(stages plan options start state report supervise top)

function(stage_of relpath out)
  if(relpath MATCHES "^([a-z_]+)/")
    set(s ${CMAKE_MATCH_1})
  elseif(relpath STREQUAL "options.h")
    set(s options)
  else()
    set(s top)
  endif()
  list(FIND stages ${s} index)
  if(index LESS 0)
    message(FATAL_ERROR "check_layers: ${relpath}: folder ${s} is no stage; "
                        "add it to check_layers.cmake and launcher/CMakeLists.txt")
  endif()
  set(${out} ${index} PARENT_SCOPE)
endfunction()

if(NOT DIR)
  message(FATAL_ERROR "check_layers: -DDIR=<launcher dir> is required")
endif()
file(GLOB_RECURSE files RELATIVE ${DIR} ${DIR}/*.cc ${DIR}/*.h)
set(bad "")
foreach(f ${files})
  stage_of(${f} own)
  file(STRINGS ${DIR}/${f} includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"launcher/")
  foreach(line ${includes})
    string(REGEX REPLACE ".*\"launcher/([^\"]+)\".*" "\\1" target "${line}")
    stage_of(${target} theirs)
    if(theirs GREATER own)
      list(GET stages ${own} own_name)
      list(GET stages ${theirs} their_name)
      list(APPEND bad "launcher/${f} (${own_name}) includes launcher/${target} (${their_name}), a later stage")
    endif()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "check_layers: includes that run back up a stage:\n  ${text}")
endif()
