# Writes a C++ source defining `std::string_view <FUNCTION>()` that returns the bytes of INPUT.
# Usage: cmake -DINPUT=page.html -DOUTPUT=page_html.cc -DFUNCTION=ns::Name -DHEADER=x.h -P this
file(READ "${INPUT}" content HEX)
string(LENGTH "${content}" hex_length)
math(EXPR num_bytes "${hex_length} / 2")
# One byte per array element: no raw-string delimiter or length limits to worry about.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," content "${content}")
string(REGEX REPLACE "(('\\\\x[0-9a-f][0-9a-f]',){16})" "\\1\n    " content "${content}")
string(REGEX MATCH "^(.*)::([^:]+)$" _ "${FUNCTION}")
set(namespace "${CMAKE_MATCH_1}")
set(name "${CMAKE_MATCH_2}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by embed_file.cmake. Do not edit.\n"
  "#include \"${HEADER}\"\n\n"
  "namespace ${namespace} {\nnamespace {\n"
  "constexpr char kBytes[${num_bytes} + 1] = {\n    ${content}'\\0'};\n"
  "}  // namespace\n\n"
  "std::string_view ${name}() { return std::string_view(kBytes, ${num_bytes}); }\n\n"
  "}  // namespace ${namespace}\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
