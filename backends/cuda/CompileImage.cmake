# Compiles one kernel image and keeps ptxas's resource report beside it:
#
#   cmake -DREPORT=PATH -P CompileImage.cmake -- COMMAND [ARG...]
#
# COMMAND is the nvcc line (with -Xptxas -v). Its ptxas report (each kernel's
# registers, stack frame and spills) goes to REPORT, which
# test_kernel_resources.py reads for every architecture the build compiles,
# so the check costs no second compilation. Any other output (a warning, an
# error) is passed on. REPORT is written whole or not at all: on a failed
# command it is removed and the step fails with the command's output.
if(NOT REPORT)
  message(FATAL_ERROR "CompileImage.cmake: REPORT is not set")
endif()

set(command)
set(seen_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 0 ${last})
  if(seen_separator)
    # A ";" inside an argument stays in it (a CMake list would split there).
    string(REPLACE ";" "\\;" argument "${CMAKE_ARGV${i}}")
    list(APPEND command "${argument}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(seen_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "CompileImage.cmake: no command after --")
endif()

file(REMOVE "${REPORT}")
execute_process(COMMAND ${command} RESULT_VARIABLE status
  OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${all}")
endif()

# ptxas's report lines are "ptxas info    : ..." and the indented lines
# under "Function properties" and "Compile time"; everything else is
# passed on.
string(REPLACE "\r" "" text "${all}")
string(REPLACE ";" "\\;" text "${text}")
string(REPLACE "\n" ";" lines "${text}")
set(other)
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^ptxas info" AND NOT line MATCHES "^    " AND
     NOT line STREQUAL "")
    string(APPEND other "${line}\n")
  endif()
endforeach()
if(other)
  message(NOTICE "${other}")
endif()
file(WRITE "${REPORT}.part" "${all}")
file(RENAME "${REPORT}.part" "${REPORT}")
