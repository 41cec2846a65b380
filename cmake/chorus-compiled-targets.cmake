# chorus::tcp_compiled and chorus::cuda_ipc, defined by this one file in chorus's own build and
# in a consumer's: the installed package includes it from chorus-config.cmake, so the TCP
# engine is compiled by the consumer's compiler, with its flags, and the package stays
# header-only and architecture independent (share/, like the headers).
#
# In:  _chorus_tcp_impl       a .cpp that includes <chorus/transport/tcp_impl.hpp>
#      _chorus_want_cuda_ipc  define chorus::cuda_ipc too (CUDAToolkit already found)
# Needs the targets chorus::chorus, Asio::Asio and Threads::Threads, and the CXX language.

if(NOT TARGET chorus::tcp_compiled)
    # EXCLUDE_FROM_ALL: compiled only for programs that link it (11 s of engine, once).
    add_library(chorus_tcp_compiled STATIC EXCLUDE_FROM_ALL "${_chorus_tcp_impl}")
    add_library(chorus::tcp_compiled ALIAS chorus_tcp_compiled)
    # PUBLIC: every TU of the program must agree that the engine lives elsewhere.
    target_compile_definitions(chorus_tcp_compiled PUBLIC CHORUS_TCP_SEPARATE_COMPILATION)
    target_link_libraries(chorus_tcp_compiled PUBLIC chorus::chorus Threads::Threads PRIVATE Asio::Asio)
endif()

if(_chorus_want_cuda_ipc AND NOT TARGET chorus::cuda_ipc)
    # Header-only like chorus::tcp, except that its .cu files link the engine above, compiled
    # by the C++ compiler: Asio never reaches nvcc. The CUDA runtime comes with each .cu
    # target (CMAKE_CUDA_RUNTIME_LIBRARY, static by default: the binaries need only the
    # driver); the include path is for C++ TUs that use <chorus/reduce/cuda_types.hpp>.
    add_library(chorus_cuda_ipc INTERFACE)
    add_library(chorus::cuda_ipc ALIAS chorus_cuda_ipc)
    target_link_libraries(chorus_cuda_ipc INTERFACE chorus::tcp_compiled)
    target_include_directories(chorus_cuda_ipc INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
    # CMake 3.25 has no cuda_std_20 feature: ask nvcc directly.
    target_compile_options(chorus_cuda_ipc INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
endif()
