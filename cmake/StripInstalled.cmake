# Install step: strips the debug information from the installed library and tools (a
# RelWithDebInfo build's library is about 70 MB with it, its tools about 130 MB). With
# TSNAP_DEBUG_FILES it is kept first in <prefix>/<libdir>/debug/<name>.debug, which the stripped
# file names (.gnu_debuglink) so that gdb finds it. Set by the install(CODE) before it:
# TSNAP_STRIP, TSNAP_OBJCOPY, TSNAP_DEBUG_FILES, TSNAP_LIBDIR and TSNAP_STRIPPED (paths
# relative to the prefix).
set(prefix "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
foreach(relative ${TSNAP_STRIPPED})
  set(file "${prefix}/${relative}")
  if(NOT EXISTS "${file}" OR IS_SYMLINK "${file}")
    continue()
  endif()
  if(TSNAP_DEBUG_FILES)
    get_filename_component(name "${file}" NAME)
    set(debug "${prefix}/${TSNAP_LIBDIR}/debug/${name}.debug")
    file(MAKE_DIRECTORY "${prefix}/${TSNAP_LIBDIR}/debug")
    execute_process(COMMAND ${TSNAP_OBJCOPY} --only-keep-debug "${file}" "${debug}"
                    RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "tsnap: could not keep the debug information of ${file}")
    endif()
  endif()
  execute_process(COMMAND ${TSNAP_STRIP} --strip-debug --strip-unneeded "${file}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tsnap: could not strip ${file}")
  endif()
  if(TSNAP_DEBUG_FILES)
    execute_process(COMMAND ${TSNAP_OBJCOPY} "--add-gnu-debuglink=${debug}" "${file}"
                    RESULT_VARIABLE rc)
  endif()
  message(STATUS "Stripped: ${file}")
endforeach()
