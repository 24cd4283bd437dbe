# Helpers shared by every directory.
#
# rs_test(NAME <name> SOURCES <files...> LIBS <targets...> LABELS <labels...> [TIMEOUT <s>])
# builds one GoogleTest binary and registers it with CTest under the given labels
# (unit, integration, gpu, multigpu). Tests run with the source tree as working directory.
function(rs_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "RINGSERVE_SOURCE_DIR=${CMAKE_SOURCE_DIR};RINGSERVE_BINARY_DIR=${CMAKE_BINARY_DIR}")
endfunction()
