# The programs every consumer project builds, whichever way it got chorus (`how` names that way
# in the errors): main.cpp on chorus::chorus and, unless CHORUS_EXPECT_TCP is OFF, tcp_main.cpp
# on chorus::tcp_compiled (the TCP engine compiled once, in the consumer: tcp_main.cpp sees no
# Asio).
function(chorus_consumers how)
    option(CHORUS_EXPECT_TCP "Fail unless chorus::tcp and chorus::tcp_compiled exist" ON)
    add_executable(consumer ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/main.cpp)  # one program, three ways to get chorus
    target_link_libraries(consumer PRIVATE chorus::chorus)
    if(NOT CHORUS_EXPECT_TCP)
        return()
    endif()
    foreach(_target IN ITEMS chorus::tcp chorus::tcp_compiled)
        if(NOT TARGET ${_target})
            message(FATAL_ERROR "${_target} is missing ${how}")
        endif()
    endforeach()
    add_executable(consumer_tcp ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/tcp_main.cpp)
    target_link_libraries(consumer_tcp PRIVATE chorus::tcp_compiled)
endfunction()
