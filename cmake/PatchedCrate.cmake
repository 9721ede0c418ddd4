# Builds a Rust crate against a patched copy of one of its dependencies (`cmake -P`, run by
# fucina_cargo_staticlib at build time). The dependency stays pinned by the crate's Cargo.lock:
#   1. `cargo fetch --locked` downloads the pinned .crate (cargo checks it against the lock);
#   2. its SHA-256 is checked again against the lock, it is unpacked under OUT_DIR and our
#      patch is applied (refusing one that does not apply cleanly);
#   3. the crate's manifest, lock and sources are copied to OUT_DIR/crate, with a
#      `[patch.crates-io]` entry for the unpacked copy and the lock entry made a path one
#      (no source, no checksum), so `cargo build --locked` still holds every other version;
#   4. cargo builds that copy into TARGET_DIR.
# Nothing is written into the source tree.
#
# Inputs (-D): CARGO, RUSTC (may be empty), CRATE_DIR, DEP_NAME, DEP_VERSION, PATCH_FILE,
# OUT_DIR, TARGET_DIR.

foreach(_var CARGO CRATE_DIR DEP_NAME DEP_VERSION PATCH_FILE OUT_DIR TARGET_DIR)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "PatchedCrate.cmake: ${_var} is not set")
  endif()
endforeach()
set(_env "CARGO_TARGET_DIR=${TARGET_DIR}")
if(RUSTC)
  list(APPEND _env "RUSTC=${RUSTC}")
endif()

# The pinned checksum, from the lock entry `name = "<dep>"` / `version = "<v>"`.
file(READ "${CRATE_DIR}/Cargo.lock" _lock)
string(REGEX MATCH
       "name = \"${DEP_NAME}\"\nversion = \"${DEP_VERSION}\"\nsource = \"[^\"]+\"\nchecksum = \"([0-9a-f]+)\""
       _entry "${_lock}")
if(NOT _entry)
  message(FATAL_ERROR "${CRATE_DIR}/Cargo.lock pins no ${DEP_NAME} ${DEP_VERSION} from a registry")
endif()
set(_checksum "${CMAKE_MATCH_1}")

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env ${_env} "${CARGO}" fetch --locked --quiet
          --manifest-path "${CRATE_DIR}/Cargo.toml"
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cargo fetch failed for ${CRATE_DIR}")
endif()

if(DEFINED ENV{CARGO_HOME})
  set(_cargo_home "$ENV{CARGO_HOME}")
else()
  set(_cargo_home "$ENV{HOME}/.cargo")
endif()
file(GLOB _archives "${_cargo_home}/registry/cache/*/${DEP_NAME}-${DEP_VERSION}.crate")
set(_archive "")
foreach(_candidate IN LISTS _archives)
  file(SHA256 "${_candidate}" _sha)
  if(_sha STREQUAL _checksum)
    set(_archive "${_candidate}")
    break()
  endif()
endforeach()
if(NOT _archive)
  message(FATAL_ERROR "no ${DEP_NAME}-${DEP_VERSION}.crate with SHA-256 ${_checksum} under "
                      "${_cargo_home}/registry/cache after cargo fetch")
endif()

set(_dep_dir "${OUT_DIR}/${DEP_NAME}-${DEP_VERSION}")
file(REMOVE_RECURSE "${_dep_dir}")
file(ARCHIVE_EXTRACT INPUT "${_archive}" DESTINATION "${OUT_DIR}")
find_program(_patch patch REQUIRED)
execute_process(
  COMMAND "${_patch}" --batch --forward --silent -p1 -d "${_dep_dir}" -i "${PATCH_FILE}"
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${PATCH_FILE} does not apply to ${DEP_NAME} ${DEP_VERSION}")
endif()

set(_copy "${OUT_DIR}/crate")
file(REMOVE_RECURSE "${_copy}")
file(COPY "${CRATE_DIR}/src" DESTINATION "${_copy}")
file(READ "${CRATE_DIR}/Cargo.toml" _manifest)
file(WRITE "${_copy}/Cargo.toml"
     "${_manifest}\n[patch.crates-io]\n${DEP_NAME} = { path = \"${_dep_dir}\" }\n")
string(REPLACE "${_entry}" "name = \"${DEP_NAME}\"\nversion = \"${DEP_VERSION}\"" _lock "${_lock}")
file(WRITE "${_copy}/Cargo.lock" "${_lock}")

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env ${_env} "${CARGO}" build --release --locked --quiet
          --manifest-path "${_copy}/Cargo.toml"
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "cargo build failed for ${_copy}")
endif()
