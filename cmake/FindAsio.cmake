# FindAsio: standalone (non-Boost) Asio, which ships no CMake package of its own.
#
# Result variables: Asio_FOUND, Asio_VERSION, Asio_INCLUDE_DIR (cache).
# Imported target:  Asio::Asio (header-only; defines ASIO_STANDALONE and ASIO_NO_DEPRECATED).
#
# Installed beside chorus-config.cmake so that find_package(chorus) can find Asio the same way.

find_path(Asio_INCLUDE_DIR NAMES asio.hpp
    PATH_SUFFIXES asio/include # a plain checkout of the asio repository
    DOC "Directory holding standalone asio.hpp")
mark_as_advanced(Asio_INCLUDE_DIR)

if(Asio_INCLUDE_DIR AND EXISTS "${Asio_INCLUDE_DIR}/asio/version.hpp")
    # ASIO_VERSION is MMmmmpp: e.g. 102201 is 1.22.1.
    file(STRINGS "${Asio_INCLUDE_DIR}/asio/version.hpp" _asio_version_line
         REGEX "^#define ASIO_VERSION +[0-9]+")
    if(_asio_version_line MATCHES "ASIO_VERSION +([0-9]+)")
        math(EXPR _asio_major "${CMAKE_MATCH_1} / 100000")
        math(EXPR _asio_minor "${CMAKE_MATCH_1} / 100 % 1000")
        math(EXPR _asio_patch "${CMAKE_MATCH_1} % 100")
        set(Asio_VERSION "${_asio_major}.${_asio_minor}.${_asio_patch}")
    endif()
    unset(_asio_version_line)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Asio
    REQUIRED_VARS Asio_INCLUDE_DIR
    VERSION_VAR Asio_VERSION)

# The guard matters: a consumer may already have created Asio::Asio (its own find module,
# or an earlier find_package), and redefining an imported target is an error.
if(Asio_FOUND AND NOT TARGET Asio::Asio)
    add_library(Asio::Asio INTERFACE IMPORTED)
    set_target_properties(Asio::Asio PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${Asio_INCLUDE_DIR}"
        # STANDALONE: use std:: instead of Boost; NO_DEPRECATED: keep us off removed APIs.
        INTERFACE_COMPILE_DEFINITIONS "ASIO_STANDALONE;ASIO_NO_DEPRECATED")
endif()
