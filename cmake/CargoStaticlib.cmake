# Rust crates with our own C ABI (the Jinja engine, the grammar engine), built by cargo as
# static libraries and imported as CMake targets.
#
#   fucina_cargo_staticlib(TARGET LIB_NAME CRATE_DIR MIN_RUST WHAT
#                          [PATCH DEP_NAME DEP_VERSION PATCH_FILE])
#
# TARGET: the imported library target; LIB_NAME: the crate's [package] name (the archive is
# lib<LIB_NAME>.a); MIN_RUST: its rust-version; WHAT: who needs it, for messages.
# PATCH: build against the pinned DEP_NAME DEP_VERSION with PATCH_FILE applied (a fix we need
# before upstream has it; cmake/PatchedCrate.cmake says how, without touching the source tree).
#
# Cargo keeps its whole target tree inside the build directory; --locked pins the dependency
# versions to the committed Cargo.lock. Cargo tracks its own inputs, so the command lists the
# crate's files only to make Ninja re-run it when they change.

# Sets `out_var` to the first cargo of at least `min_rust` among FUCINA_CARGO (a cache entry or
# -D), $CARGO_HOME/bin, ~/.cargo/bin, every directory of PATH, /usr/local/bin and /usr/bin, in
# that order. An older cargo earlier on PATH (a distribution's, beside a newer one) is passed
# over rather than fatal; with none new enough the error lists every cargo seen and its version.
function(fucina_find_cargo out_var min_rust what)
  set(_candidates "")
  if(FUCINA_CARGO)
    list(APPEND _candidates "${FUCINA_CARGO}")
  endif()
  set(_dirs "")
  if(DEFINED ENV{CARGO_HOME})
    list(APPEND _dirs "$ENV{CARGO_HOME}/bin")
  endif()
  if(DEFINED ENV{HOME})
    list(APPEND _dirs "$ENV{HOME}/.cargo/bin")
  endif()
  string(REPLACE ":" ";" _path "$ENV{PATH}")
  foreach(_dir ${_dirs} ${_path} /usr/local/bin /usr/bin)
    # Not REALPATH: rustup's cargo is a link to rustup, which acts on the name it is run by.
    if(NOT _dir STREQUAL "" AND EXISTS "${_dir}/cargo" AND NOT IS_DIRECTORY "${_dir}/cargo")
      list(APPEND _candidates "${_dir}/cargo")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _candidates)
  set(_seen "")
  foreach(_cargo IN LISTS _candidates)
    execute_process(COMMAND "${_cargo}" --version OUTPUT_VARIABLE _version
                    RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REGEX MATCH "^cargo ([0-9]+\\.[0-9]+\\.[0-9]+)" _match "${_version}")
    if(NOT _rc EQUAL 0 OR NOT _match)
      list(APPEND _seen "${_cargo} (--version failed)")
    elseif(CMAKE_MATCH_1 VERSION_LESS min_rust)
      list(APPEND _seen "cargo ${CMAKE_MATCH_1} at ${_cargo}")
    else()
      set(${out_var} "${_cargo}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  if(NOT _seen)
    message(FATAL_ERROR "cargo not found: ${what} need cargo (Rust >= ${min_rust}, install with rustup)")
  endif()
  list(JOIN _seen ", " _seen)
  message(FATAL_ERROR "found ${_seen}; ${what} need cargo (Rust >= ${min_rust}, install with rustup)")
endfunction()

function(fucina_cargo_staticlib target lib_name crate_dir min_rust what)
  cmake_parse_arguments(PARSE_ARGV 5 _arg "" "" "PATCH")
  fucina_find_cargo(_cargo "${min_rust}" "${what}")
  set(FUCINA_CARGO "${_cargo}" CACHE FILEPATH "cargo for the Rust crates (Rust >= each crate's rust-version)" FORCE)
  # Cargo runs the `rustc` first on PATH unless RUSTC names one: the one beside the chosen cargo
  # (same toolchain), so an older rustc earlier on PATH is not used either.
  get_filename_component(_bin "${_cargo}" DIRECTORY)
  set(_rustc "")
  set(_rustc_env "")
  if(EXISTS "${_bin}/rustc")
    set(_rustc "${_bin}/rustc")
    set(_rustc_env "RUSTC=${_rustc}")
  endif()

  set(_target_dir "${CMAKE_CURRENT_BINARY_DIR}/cargo")
  set(_lib "${_target_dir}/release/${CMAKE_STATIC_LIBRARY_PREFIX}${lib_name}${CMAKE_STATIC_LIBRARY_SUFFIX}")
  file(GLOB _sources CONFIGURE_DEPENDS "${crate_dir}/src/*.rs")
  if(_arg_PATCH)
    list(LENGTH _arg_PATCH _n)
    if(NOT _n EQUAL 3)
      message(FATAL_ERROR "fucina_cargo_staticlib(${target}): PATCH takes DEP_NAME DEP_VERSION PATCH_FILE")
    endif()
    list(GET _arg_PATCH 0 _dep_name)
    list(GET _arg_PATCH 1 _dep_version)
    list(GET _arg_PATCH 2 _patch_file)
    set(_build_command
        ${CMAKE_COMMAND} "-DCARGO=${_cargo}" "-DRUSTC=${_rustc}" "-DCRATE_DIR=${crate_dir}"
        "-DDEP_NAME=${_dep_name}" "-DDEP_VERSION=${_dep_version}" "-DPATCH_FILE=${_patch_file}"
        "-DOUT_DIR=${CMAKE_CURRENT_BINARY_DIR}/patched" "-DTARGET_DIR=${_target_dir}"
        -P "${PROJECT_SOURCE_DIR}/cmake/PatchedCrate.cmake")
    set(_extra_depends "${_patch_file}" "${PROJECT_SOURCE_DIR}/cmake/PatchedCrate.cmake")
  else()
    set(_build_command
        ${CMAKE_COMMAND} -E env "CARGO_TARGET_DIR=${_target_dir}" ${_rustc_env}
        "${_cargo}" build --release --locked --quiet --manifest-path "${crate_dir}/Cargo.toml")
    set(_extra_depends "")
  endif()
  add_custom_command(
    OUTPUT "${_lib}"
    COMMAND ${_build_command}
    DEPENDS "${crate_dir}/Cargo.toml" "${crate_dir}/Cargo.lock" ${_sources} ${_extra_depends}
    WORKING_DIRECTORY "${crate_dir}"
    COMMENT "cargo build: ${lib_name} staticlib"
    VERBATIM)
  add_custom_target(${target}_cargo DEPENDS "${_lib}")

  add_library(${target} STATIC IMPORTED GLOBAL)
  # A Rust staticlib carries the Rust standard library, which needs these system libraries
  # (`cargo rustc -- --print native-static-libs` lists them).
  set_target_properties(${target} PROPERTIES
    IMPORTED_LOCATION "${_lib}"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;gcc_s;util;rt;dl;m")
  add_dependencies(${target} ${target}_cargo)
endfunction()
