# Rust crates with our own C ABI (the Jinja engine, the grammar engine), built by cargo as
# static libraries and imported as CMake targets.
#
#   fucina_cargo_staticlib(TARGET LIB_NAME CRATE_DIR MIN_RUST WHAT)
#
# TARGET: the imported library target; LIB_NAME: the crate's [package] name (the archive is
# lib<LIB_NAME>.a); MIN_RUST: its rust-version; WHAT: who needs it, for messages.
#
# Cargo keeps its whole target tree inside the build directory; --locked pins the dependency
# versions to the committed Cargo.lock. Cargo tracks its own inputs, so the command lists the
# crate's files only to make Ninja re-run it when they change.
function(fucina_cargo_staticlib target lib_name crate_dir min_rust what)
  find_program(FUCINA_CARGO cargo HINTS "$ENV{CARGO_HOME}/bin" "$ENV{HOME}/.cargo/bin")
  if(NOT FUCINA_CARGO)
    message(FATAL_ERROR "cargo not found: ${what} need cargo (Rust >= ${min_rust}, install with rustup)")
  endif()
  execute_process(COMMAND "${FUCINA_CARGO}" --version OUTPUT_VARIABLE _version
                  RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  string(REGEX MATCH "^cargo ([0-9]+\\.[0-9]+\\.[0-9]+)" _match "${_version}")
  if(NOT _rc EQUAL 0 OR NOT _match)
    message(FATAL_ERROR "${FUCINA_CARGO} --version failed: ${what} need cargo (Rust >= ${min_rust}, install with rustup)")
  endif()
  if(CMAKE_MATCH_1 VERSION_LESS min_rust)
    message(FATAL_ERROR "found cargo ${CMAKE_MATCH_1} at ${FUCINA_CARGO}; ${what} need cargo (Rust >= ${min_rust}, install with rustup)")
  endif()

  set(_target_dir "${CMAKE_CURRENT_BINARY_DIR}/cargo")
  set(_lib "${_target_dir}/release/${CMAKE_STATIC_LIBRARY_PREFIX}${lib_name}${CMAKE_STATIC_LIBRARY_SUFFIX}")
  file(GLOB _sources CONFIGURE_DEPENDS "${crate_dir}/src/*.rs")
  add_custom_command(
    OUTPUT "${_lib}"
    COMMAND ${CMAKE_COMMAND} -E env "CARGO_TARGET_DIR=${_target_dir}"
            "${FUCINA_CARGO}" build --release --locked --quiet
            --manifest-path "${crate_dir}/Cargo.toml"
    DEPENDS "${crate_dir}/Cargo.toml" "${crate_dir}/Cargo.lock" ${_sources}
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
