# Included into llama.cpp's top-level project by tools/build_native.py
# (CMAKE_PROJECT_llama.cpp_INCLUDE): once every target exists, link
# flush_log_at_exit.cpp into llama-speculative-simple (see that file for why).
set(_pydflash_flush_src "${CMAKE_CURRENT_LIST_DIR}/flush_log_at_exit.cpp")
function(_pydflash_flush_log_at_exit)
    if(TARGET llama-speculative-simple)
        target_sources(llama-speculative-simple PRIVATE "${_pydflash_flush_src}")
    endif()
endfunction()
cmake_language(DEFER CALL _pydflash_flush_log_at_exit)
