# SPDX-License-Identifier: Apache-2.0
# sluice_add_test(NAME SOURCES a.cpp ... [LIBS ...] [LABELS ...])
# Adds a GoogleTest executable and registers it with CTest. In the TSan build
# (SLUICE_CONCURRENCY_TESTS_ONLY) only tests labelled 'concurrency' are built.
function(sluice_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  if(SLUICE_CONCURRENCY_TESTS_ONLY AND NOT "concurrency" IN_LIST ARG_LABELS)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  add_test(NAME ${name} COMMAND ${name})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
  if("concurrency" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY SLUICE_CONCURRENCY_TESTS ${name})
  endif()
endfunction()

# sluice_add_benchmark(NAME SOURCES a.cpp ... [LIBS ...])
function(sluice_add_benchmark name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} benchmark::benchmark)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
endfunction()

# sluice_check_headers(TARGET LIBS ... HEADERS ...)
# Compiles each header alone (one generated .cpp per header), so every public header includes
# what it uses.
function(sluice_check_headers target)
  cmake_parse_arguments(ARG "" "" "LIBS;HEADERS" ${ARGN})
  set(sources)
  foreach(header ${ARG_HEADERS})
    string(MAKE_C_IDENTIFIER ${header} id)
    set(source ${CMAKE_CURRENT_BINARY_DIR}/checkheaders/${id}.cpp)
    file(CONFIGURE OUTPUT ${source} CONTENT "#include <${header}>\n")
    list(APPEND sources ${source})
  endforeach()
  add_library(${target} OBJECT ${sources})
  target_link_libraries(${target} PRIVATE ${ARG_LIBS})
endfunction()

# sluice_add_proto_library(TARGET ROOT dir PROTOS path/a ... [SERVICES path/b ...])
# A static library of the C++ that protoc generates from ROOT/<path>.proto (and gRPC's plugin, for
# those in SERVICES) into the build tree, under the same relative paths, so that sources include
# "path/a.pb.h" as the .proto files import each other. Generated code is not ours to fix: it builds
# without warnings, and its headers are system headers where our sources include them.
function(sluice_add_proto_library target)
  cmake_parse_arguments(ARG "" "ROOT" "PROTOS;SERVICES" ${ARGN})
  set(generated ${CMAKE_CURRENT_BINARY_DIR}/generated)
  set(sources)
  foreach(proto ${ARG_PROTOS})
    set(out ${generated}/${proto})
    set(outputs ${out}.pb.cc ${out}.pb.h)
    set(grpc_args)
    if(proto IN_LIST ARG_SERVICES)
      list(APPEND outputs ${out}.grpc.pb.cc ${out}.grpc.pb.h)
      set(grpc_args --grpc_out=${generated} --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>)
    endif()
    add_custom_command(
      OUTPUT ${outputs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${generated}
      COMMAND $<TARGET_FILE:protobuf::protoc> -I ${ARG_ROOT} --cpp_out=${generated} ${grpc_args}
              ${ARG_ROOT}/${proto}.proto
      DEPENDS ${ARG_ROOT}/${proto}.proto
      COMMENT "Generating C++ from ${proto}.proto"
      VERBATIM)
    list(APPEND sources ${outputs})
  endforeach()
  add_library(${target} STATIC ${sources})
  target_compile_options(${target} PRIVATE -w)
  target_include_directories(${target} SYSTEM PUBLIC $<BUILD_INTERFACE:${generated}>)
  target_link_libraries(${target} PUBLIC protobuf::libprotobuf gRPC::grpc++)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
