# The dynamic-backend variant of pydflash (see CMakeLists.txt): included before
# llama.cpp is added, so the cache settings below reach ggml.
#
#   PYDFLASH_BACKEND_DL=1        CPU backend as a loadable module (tests the machinery)
#   PYDFLASH_CUDA=1 / -DGGML_CUDA=ON   adds the CUDA backend module
#   PYDFLASH_CUDA_ARCHITECTURES  CUDA architectures (else CMAKE_CUDA_ARCHITECTURES, else
#                                the default list below)
#   PYDFLASH_CUBLAS_DIR          a folder with include/cublas*.h and lib/libcublas*.so.13
#                                (e.g. <site-packages>/nvidia/cu13 of the nvidia-cublas
#                                wheel), for a CUDA toolkit that has no cuBLAS
#   PYDFLASH_CPU_ALL_VARIANTS=1  build ggml's CPU backend once per x86 ISA level
#                                (GGML_CPU_ALL_VARIANTS; ~10x the CPU-backend compile)

message(STATUS "pydflash: dynamic ggml backends (GGML_BACKEND_DL), shared llama/ggml libraries")
set(BUILD_SHARED_LIBS ON CACHE BOOL "" FORCE)
set(GGML_BACKEND_DL ON CACHE BOOL "" FORCE)
# A wheel meant for other machines: no -march=native in the CPU backend unless asked
# (PYDFLASH_NATIVE=1 or -DGGML_NATIVE=ON). Without it ggml enables AVX/AVX2/FMA/F16C/BMI2.
set(GGML_NATIVE OFF CACHE BOOL "")
if("$ENV{PYDFLASH_CPU_ALL_VARIANTS}" STREQUAL "1")
  set(GGML_CPU_ALL_VARIANTS ON CACHE BOOL "" FORCE)
endif()

if(GGML_CUDA)
  if(DEFINED ENV{PYDFLASH_CUDA_ARCHITECTURES})
    set(CMAKE_CUDA_ARCHITECTURES "$ENV{PYDFLASH_CUDA_ARCHITECTURES}" CACHE STRING "" FORCE)
  elseif(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    # nvcc 13 knows 75 and newer. Real code for the common data-centre and desk GPUs:
    # 80 (A100), 86 (RTX 30xx, A10/A40), 89 (RTX 40xx, L4/L40), 90 (H100/H200),
    # 120a (RTX 50xx / RTX PRO Blackwell); 75 as PTX that newer GPUs can JIT.
    set(CMAKE_CUDA_ARCHITECTURES "75-virtual;80-real;86-real;89-real;90-real;120a-real" CACHE STRING "")
  endif()
  message(STATUS "pydflash: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES}")

  if(DEFINED ENV{PYDFLASH_CUBLAS_DIR})
    # The nvidia-cublas wheel has only versioned names (libcublas.so.13): link through
    # unversioned symlinks in the build folder; the binary still records the soname.
    set(_cublas_dir "$ENV{PYDFLASH_CUBLAS_DIR}")
    set(_links ${CMAKE_BINARY_DIR}/pydflash-cublas)
    file(MAKE_DIRECTORY ${_links})
    foreach(_lib cublas cublasLt)
      file(GLOB _found "${_cublas_dir}/lib/lib${_lib}.so.*")
      if(NOT _found)
        message(FATAL_ERROR "pydflash: no lib${_lib}.so.* in ${_cublas_dir}/lib (PYDFLASH_CUBLAS_DIR)")
      endif()
      list(GET _found 0 _real)
      file(CREATE_LINK ${_real} ${_links}/lib${_lib}.so SYMBOLIC)
      set(CUDA_${_lib}_LIBRARY ${_links}/lib${_lib}.so CACHE FILEPATH "" FORCE)
    endforeach()
    set(PYDFLASH_CUBLAS_INCLUDE ${_cublas_dir}/include)
  endif()
endif()

# Called after _core is defined: RPATHs, unversioned library names, install rules.
function(pydflash_install_backend_dl core)
  set(_libs llama llama-common ggml ggml-base)
  set(_modules "")
  foreach(_t IN LISTS GGML_AVAILABLE_BACKENDS)
    if(TARGET ${_t})
      list(APPEND _modules ${_t})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _modules)
  message(STATUS "pydflash: backend modules: ${_modules}")

  foreach(_t IN LISTS _libs _modules)
    # One file per library in the wheel (a wheel stores symlinks as copies): no
    # VERSION/SOVERSION, so the soname is the plain libX.so.
    set_property(TARGET ${_t} PROPERTY VERSION)
    set_property(TARGET ${_t} PROPERTY SOVERSION)
    set_property(TARGET ${_t} PROPERTY INSTALL_RPATH "$ORIGIN")
    set_property(TARGET ${_t} PROPERTY PUBLIC_HEADER)  # no C headers in the wheel
  endforeach()
  if(TARGET ggml-cuda)
    # The cuda extra's wheels (nvidia-cuda-runtime, nvidia-cublas) install into
    # site-packages/nvidia/cu13/lib; pydflash/lib/ is two levels below site-packages.
    # Python also preloads them (pydflash/_backends.py); a system CUDA works through
    # the usual library path.
    set_property(TARGET ggml-cuda PROPERTY INSTALL_RPATH "$ORIGIN;$ORIGIN/../../nvidia/cu13/lib")
    if(PYDFLASH_CUBLAS_INCLUDE)
      target_include_directories(ggml-cuda SYSTEM PRIVATE ${PYDFLASH_CUBLAS_INCLUDE})
    endif()
  endif()
  # Built with _core (ggml depends on its backend modules in this mode).
  add_dependencies(${core} ${_modules})
  set_property(TARGET ${core} PROPERTY INSTALL_RPATH "$ORIGIN/lib")
  install(TARGETS ${_libs} LIBRARY DESTINATION pydflash/lib)
  install(TARGETS ${_modules} LIBRARY DESTINATION pydflash/lib)
endfunction()
