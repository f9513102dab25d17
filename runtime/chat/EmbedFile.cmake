# cmake -DINPUT=file -DOUTPUT=file.inc -P EmbedFile.cmake
# Writes INPUT's bytes as a comma-separated list of hex literals, to include
# in a C++ array initializer (any byte, no escaping questions).
file(READ "${INPUT}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 16 bytes a line.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}.tmp" "// Generated from ${name} by EmbedFile.cmake; do not edit.\n${bytes}\n")
# Rewrite only on change, so dependents are not rebuilt needlessly.
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUTPUT}.tmp" "${OUTPUT}")
file(REMOVE "${OUTPUT}.tmp")
