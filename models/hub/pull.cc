#include "models/hub/pull.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/gguf/gguf.h"
#include "models/hub/sha256.h"
#include "models/hub/zip_member.h"
#include "models/log/log.h"

namespace fucina {
namespace {

// Debian's Abseil has its own string_view class rather than an alias of std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return absl::StartsWithIgnoreCase(Av(s), Av(prefix));
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

absl::Status BadReference(std::string_view ref, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid model reference '", Av(ref), "': ", Av(why)));
}

// Splits "a/b/c" and rejects segments that would escape or alias a cache directory.
absl::StatusOr<std::vector<std::string>> PathSegments(std::string_view ref, std::string_view path) {
  std::vector<std::string> segments = absl::StrSplit(Av(path), '/');
  for (const std::string& s : segments) {
    if (s.empty() || s == "." || s == "..") {
      return BadReference(ref, "empty, '.' and '..' path segments are not allowed");
    }
  }
  return segments;
}

absl::StatusOr<ModelReference> ParseHf(std::string_view ref, std::string_view rest,
                                       std::string_view hf_endpoint) {
  std::string revision = "main";
  // Everything after the first '@' is the revision, so "FILE@refs/pr/1" is rejected below
  // rather than read as a file "1" in a folder "FILE@refs/pr".
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    revision = std::string(rest.substr(at + 1));
    rest = rest.substr(0, at);
    const bool charset_ok = std::all_of(revision.begin(), revision.end(), [](char c) {
      return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
    });
    if (revision.empty() || !charset_ok || revision == "." || revision == "..") {
      return BadReference(ref, "the revision after '@' must be a branch, tag or commit id made "
                               "of letters, digits, '.', '_' and '-'");
    }
  }
  auto segments = PathSegments(ref, rest);
  if (!segments.ok()) return segments.status();
  if (segments->size() < 3) {
    return BadReference(ref, "expected hf://ORG/REPO/FILE (a file inside the repository)");
  }
  std::string endpoint(hf_endpoint);
  while (absl::EndsWith(endpoint, "/")) endpoint.pop_back();
  if (!StartsWithNoCase(endpoint, "http://") && !StartsWithNoCase(endpoint, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("HF_ENDPOINT must be an http:// or https:// URL, got '", Av(hf_endpoint),
                     "'"));
  }
  const std::vector<std::string>& s = *segments;
  const std::string dirs = absl::StrJoin(s.begin() + 2, s.end() - 1, "/");
  ModelReference out;
  out.file = s.back();
  out.base_url = absl::StrCat(endpoint, "/", s[0], "/", s[1], "/resolve/", revision, "/", dirs,
                              dirs.empty() ? "" : "/");
  out.cache_dir = absl::StrCat("hf/", s[0], "/", s[1], "/", revision, dirs.empty() ? "" : "/",
                               dirs);
  out.send_hf_token = true;
  return out;
}

absl::StatusOr<ModelReference> ParseUrl(std::string_view ref, std::string_view scheme,
                                        std::string_view rest, std::string_view hf_endpoint) {
  ModelReference out;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    out.query = std::string(rest.substr(q));
    rest = rest.substr(0, q);
  }
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash + 1 == rest.size()) {
    return BadReference(ref, "the URL names no file");
  }
  const std::string_view authority = rest.substr(0, slash);
  // user:password@ is passed on to curl but kept out of the cache path.
  std::string_view host_port = authority.substr(authority.rfind('@') + 1);
  std::string host, port;
  if (host_port.starts_with('[')) {  // [IPv6]:port
    const size_t close = host_port.find(']');
    if (close == std::string_view::npos) return BadReference(ref, "unterminated '[' in the host");
    host = std::string(host_port.substr(1, close - 1));
    const std::string_view after = host_port.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return BadReference(ref, "unexpected text after ']' in the host");
      port = std::string(after.substr(1));
    }
  } else {
    const size_t colon = host_port.rfind(':');
    host = std::string(host_port.substr(0, colon));
    if (colon != std::string_view::npos) port = std::string(host_port.substr(colon + 1));
  }
  if (host.empty()) return BadReference(ref, "the URL has no host");
  if (!std::all_of(port.begin(), port.end(), absl::ascii_isdigit)) {
    return BadReference(ref, "the port must be a number");
  }
  if ((scheme == "http" && port == "80") || (scheme == "https" && port == "443")) port.clear();
  absl::AsciiStrToLower(&host);
  std::replace(host.begin(), host.end(), ':', '_');  // IPv6 colons are awkward in file names.

  const std::string_view path = rest.substr(slash + 1);
  auto segments = PathSegments(ref, path);
  if (!segments.ok()) return segments.status();
  out.file = segments->back();
  segments->pop_back();
  out.base_url =
      absl::StrCat(Av(scheme), "://", Av(rest.substr(0, rest.size() - out.file.size())));
  out.cache_dir = absl::StrCat(host, port.empty() ? "" : "_", port);
  for (const std::string& s : *segments) absl::StrAppend(&out.cache_dir, "/", s);
  std::string endpoint(hf_endpoint);
  while (absl::EndsWith(endpoint, "/")) endpoint.pop_back();
  out.send_hf_token = !endpoint.empty() && StartsWithNoCase(out.url(), endpoint + "/");
  return out;
}

// ---------------------------------------------------------------------------------------------
// Downloading one file.

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// A download's progress, reported (models/log/log.h) at most ten times a second; the binary
// draws it.
class DownloadProgress {
 public:
  explicit DownloadProgress(std::string name) : name_(std::move(name)) {}

  // `done` of `total` bytes (-1: unknown), `fetched` of them by this process.
  void Report(int64_t done, int64_t total, int64_t fetched, bool force) {
    const auto now = std::chrono::steady_clock::now();
    if (!force && reported_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    reported_ = true;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    ReportProgress({.task = name_,
                    .done = done,
                    .total = std::max<int64_t>(0, total),
                    .bytes_per_second = seconds > 0 ? fetched / seconds : 0.0});
  }
  void End() {
    if (reported_) ReportProgress({.task = name_, .finished = true});
    reported_ = false;
  }

 private:
  std::string name_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_;
  bool reported_ = false;
};

// State of one HTTP request writing into the .part file.
struct Transfer {
  int fd = -1;
  int64_t offset = 0;  // bytes of the .part file the request continues from
  // From the last response's headers (each redirect's response resets them).
  long status = 0;
  int64_t range_start = -1;
  int64_t range_total = -1;
  bool body_started = false;
  bool restart = false;  // a 206 for another range than asked: start over without Range
  int64_t fetched = 0;
  std::string write_error;
  DownloadProgress* progress = nullptr;
  int64_t expected = -1;  // total size when known, for the progress report
};

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * count);
  while (!line.empty() && absl::ascii_isspace(line.back())) line.remove_suffix(1);
  if (line.starts_with("HTTP/")) {  // "HTTP/1.1 206 Partial Content"
    const size_t space = line.find(' ');
    t->status = 0;
    if (space != std::string_view::npos &&
        !absl::SimpleAtoi(Av(line.substr(space + 1, 3)), &t->status)) {
      t->status = 0;
    }
    t->range_start = t->range_total = -1;
  } else if (StartsWithNoCase(line, "content-range:")) {
    // "Content-Range: bytes START-END/TOTAL" (TOTAL may be '*').
    std::string_view value = line.substr(14);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (value.starts_with("bytes ")) {
      value.remove_prefix(6);
      const size_t dash = value.find('-');
      const size_t slash = value.find('/');
      if (dash != std::string_view::npos && slash != std::string_view::npos && dash < slash) {
        if (!absl::SimpleAtoi(Av(value.substr(0, dash)), &t->range_start)) t->range_start = -1;
        if (!absl::SimpleAtoi(Av(value.substr(slash + 1)), &t->range_total)) t->range_total = -1;
      }
    }
  }
  return size * count;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  if (!t->body_started) {
    t->body_started = true;
    if (t->status == 206) {
      if (t->range_start != t->offset) {
        t->restart = true;
        return 0;
      }
    } else if (t->status == 200) {
      // The server ignored our Range header and sends the whole file: start the .part over.
      if (t->offset > 0) {
        if (::ftruncate(t->fd, 0) != 0 || ::lseek(t->fd, 0, SEEK_SET) != 0) {
          t->write_error = std::strerror(errno);
          return 0;
        }
        t->offset = 0;
      }
    } else {
      return 0;  // An error page: the status alone is reported.
    }
  }
  const size_t n = size * count;
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::write(t->fd, data + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      t->write_error = std::strerror(errno);
      return 0;
    }
    done += static_cast<size_t>(w);
  }
  t->fetched += static_cast<int64_t>(n);
  return n;
}

int OnProgress(void* user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->body_started && (t->status == 200 || t->status == 206)) {
    t->expected = dltotal > 0 ? t->offset + dltotal : -1;
    t->progress->Report(t->offset + dlnow, t->expected, dlnow, false);
  }
  return 0;
}

int64_t FileSize(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

struct Request {
  std::string url;
  std::string part_path;
  bool send_hf_token = false;
  DownloadProgress* progress = nullptr;
};

enum class Outcome { kDone, kRestart };

// One GET continuing from `t->offset` bytes.
absl::StatusOr<Outcome> Get(const Request& r, Transfer* t) {
  InitCurlOnce();
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(nullptr, curl_slist_free_all);
  const std::string token = Env("HF_TOKEN");
  if (r.send_hf_token && !token.empty()) {
    headers.reset(curl_slist_append(nullptr, ("Authorization: Bearer " + token).c_str()));
  }
  char error[CURL_ERROR_SIZE] = {0};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, r.url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "fucina");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  // A stalled transfer fails (and can be resumed) instead of hanging forever.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  if (headers != nullptr) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  // CURLOPT_RANGE rather than CURLOPT_RESUME_FROM: with the latter curl fails outright when the
  // server ignores the range, where we would rather take the whole file.
  const std::string range = absl::StrCat(t->offset, "-");
  if (t->offset > 0) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, t);
  if (t->progress != nullptr) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, t);
  }
  const CURLcode rc = curl_easy_perform(c);
  if (t->progress != nullptr && t->fetched > 0) {
    t->progress->Report(t->offset + t->fetched, t->expected, t->fetched, true);
  }
  if (t->progress != nullptr) t->progress->End();

  if (t->restart) return Outcome::kRestart;
  if (!t->write_error.empty()) {
    return absl::InternalError(absl::StrCat("cannot write ", r.part_path, ": ", t->write_error));
  }
  char* effective = nullptr;
  curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &effective);
  const std::string where = (effective != nullptr && r.url != effective)
                                ? absl::StrCat(" after a redirect to ", effective)
                                : "";
  const long status = t->status;
  if (status == 416 && t->offset > 0) return Outcome::kRestart;
  if (status != 0 && status != 200 && status != 206) {
    const std::string code = absl::StrCat("(HTTP ", status, where, ")");
    if (status == 404) return absl::NotFoundError(absl::StrCat("not found: ", r.url, " ", code));
    if (status == 401 || status == 403) {
      std::string hint;
      if (r.send_hf_token) {
        hint = token.empty() ? "; set HF_TOKEN for gated or private repositories"
                             : "; check that HF_TOKEN grants access to this repository";
      }
      return absl::PermissionDeniedError(
          absl::StrCat("access denied: ", r.url, " ", code, hint));
    }
    return absl::UnavailableError(absl::StrCat("fetching ", r.url, " failed: HTTP ", status,
                                               where));
  }
  if (rc != CURLE_OK) {
    const int64_t kept = FileSize(t->fd);
    return absl::UnavailableError(absl::StrCat(
        "fetching ", r.url, " failed: ", error[0] != '\0' ? error : curl_easy_strerror(rc),
        kept > 0 ? absl::StrCat("; ", kept, " bytes kept in ", r.part_path,
                                ": pull again to resume")
                 : ""));
  }
  if (status == 200 && !t->body_started && ::ftruncate(t->fd, 0) != 0) {  // an empty file
    return absl::InternalError(absl::StrCat("cannot truncate ", r.part_path, ": ",
                                            std::strerror(errno)));
  }
  if (status == 206 && t->range_total >= 0 && FileSize(t->fd) != t->range_total) {
    return absl::DataLossError(absl::StrCat("fetching ", r.url, " ended at ", FileSize(t->fd),
                                            " bytes but the server announced ", t->range_total));
  }
  return Outcome::kDone;
}

absl::Status CheckSha256(const std::string& path, const std::string& expected,
                         std::string_view what) {
  if (expected.empty()) return absl::OkStatus();
  auto actual = Sha256FileHex(path);
  if (!actual.ok()) return actual.status();
  if (*actual == expected) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("sha256 mismatch for ", Av(what),
                                          ": expected ", expected, ", got ", *actual));
}

// Closes the descriptor (releasing its lock) on every path out of FetchFile.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens (creating) `part` into `fd` and locks it: two pulls of one file would interleave their
// writes into the same .part, so the second is refused naming `what` it raced.
absl::Status OpenLockedPart(const std::string& part, const char* what, Fd& fd) {
  fd.fd = ::open(part.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd.fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", part, ": ",
                                                    std::strerror(errno)));
  }
  if (::flock(fd.fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(part, " is being written by another ", what));
  }
  return absl::OkStatus();
}

// Fetches `url` to `dest` through `dest`.part unless `dest` already exists.
absl::Status FetchFile(const std::string& url, const std::string& dest, bool send_hf_token,
                       const std::string& sha256, bool progress) {
  std::error_code ec;
  if (std::filesystem::exists(dest, ec)) {
    return CheckSha256(dest, sha256,
                       absl::StrCat(dest, " (already present; remove it to fetch it again)"));
  }
  const std::filesystem::path parent = std::filesystem::path(dest).parent_path();
  if (!parent.empty() && !std::filesystem::create_directories(parent, ec) && ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create directory ", parent.string(), ": ", ec.message()));
  }
  const std::string part = dest + ".part";
  Fd fd;
  if (absl::Status s = OpenLockedPart(part, "download of the same file", fd); !s.ok()) return s;
  if (std::filesystem::exists(dest, ec)) {
    // Another download of this file finished between the first check and taking the lock; the
    // .part we hold is then the empty one our open() just created.
    if (FileSize(fd.fd) == 0) ::unlink(part.c_str());
    return CheckSha256(dest, sha256, dest);
  }

  DownloadProgress bar(std::filesystem::path(dest).filename().string());
  Request request{url, part, send_hf_token, progress ? &bar : nullptr};
  bool done = false;
  for (int attempt = 0; attempt < 2 && !done; ++attempt) {
    Transfer t;
    t.fd = fd.fd;
    t.progress = request.progress;
    if (attempt > 0 && ::ftruncate(fd.fd, 0) != 0) {
      return absl::InternalError(absl::StrCat("cannot truncate ", part, ": ",
                                              std::strerror(errno)));
    }
    t.offset = FileSize(fd.fd);
    if (t.offset < 0 || ::lseek(fd.fd, t.offset, SEEK_SET) != t.offset) {
      return absl::InternalError(absl::StrCat("cannot seek in ", part, ": ",
                                              std::strerror(errno)));
    }
    auto outcome = Get(request, &t);
    if (!outcome.ok()) {
      // Only a .part with data is worth keeping for a resume.
      if (FileSize(fd.fd) == 0) ::unlink(part.c_str());
      return outcome.status();
    }
    done = *outcome == Outcome::kDone;
  }
  if (!done) {
    return absl::UnavailableError(absl::StrCat(
        "fetching ", url, " failed: the server did not honour the byte range it was asked for"));
  }
  if (absl::Status s = CheckSha256(part, sha256, url); !s.ok()) {
    ::unlink(part.c_str());  // Resuming a corrupt file would only repeat the mismatch.
    return absl::Status(s.code(), absl::StrCat(s.message(), " (the download was discarded)"));
  }
  // Make the data durable before the rename makes it count as complete.
  if (::fsync(fd.fd) != 0 || ::rename(part.c_str(), dest.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot move ", part, " to ", dest, ": ",
                                            std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Fetches the zip archive at `url` beside `dest`, takes `member` out of it into `dest` (through
// `dest`.part) and deletes the archive, unless `dest` already exists. The archive is kept only
// while a download of it is incomplete, so an interrupted pull resumes.
absl::Status FetchMember(const std::string& url, const std::string& member,
                         const std::string& dest, bool send_hf_token, const std::string& sha256,
                         bool progress) {
  std::error_code ec;
  if (std::filesystem::exists(dest, ec)) {
    return CheckSha256(dest, sha256,
                       absl::StrCat(dest, " (already present; remove it to fetch it again)"));
  }
  const std::string archive = dest + ".archive";
  if (absl::Status s = FetchFile(url, archive, send_hf_token, "", progress); !s.ok()) return s;
  const std::string part = dest + ".part";
  Fd fd;
  if (absl::Status s = OpenLockedPart(part, "pull of the same member", fd); !s.ok()) return s;
  if (std::filesystem::exists(dest, ec)) {  // another pull finished while we fetched
    ::unlink(part.c_str());
    return CheckSha256(dest, sha256, dest);
  }
  if (::ftruncate(fd.fd, 0) != 0) {
    return absl::InternalError(absl::StrCat("cannot truncate ", part, ": ",
                                            std::strerror(errno)));
  }
  auto extracted = ExtractZipMember(archive, member, fd.fd);
  absl::Status s = extracted.ok() ? CheckSha256(part, sha256, absl::StrCat(url, "#member=", member))
                                  : extracted.status();
  if (!s.ok()) {
    // Taking the member out again would fail the same way: start over from the server.
    ::unlink(part.c_str());
    ::unlink(archive.c_str());
    return absl::Status(s.code(), absl::StrCat(s.message(), " (the download was discarded)"));
  }
  if (::fsync(fd.fd) != 0 || ::rename(part.c_str(), dest.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot move ", part, " to ", dest, ": ",
                                            std::strerror(errno)));
  }
  ::unlink(archive.c_str());
  return absl::OkStatus();
}

// Where each part goes: see PullOptions::output.
absl::StatusOr<std::vector<std::string>> Destinations(const std::vector<ModelReference>& parts,
                                                      const std::string& output) {
  std::vector<std::string> dests;
  if (output.empty()) {
    auto cache = ModelCacheDir();
    if (!cache.ok()) return cache.status();
    for (const ModelReference& p : parts) dests.push_back(*cache + "/" + p.cache_path());
    return dests;
  }
  std::error_code ec;
  if (absl::EndsWith(output, "/") || std::filesystem::is_directory(output, ec)) {
    std::string dir = output;
    while (dir.size() > 1 && absl::EndsWith(dir, "/")) dir.pop_back();
    for (const ModelReference& p : parts) dests.push_back(dir + "/" + p.local_name());
    return dests;
  }
  if (parts.size() == 1) return std::vector<std::string>{output};
  std::string prefix;
  uint32_t part = 0, count = 0;
  if (!gguf::ParseSplitPath(output, &prefix, &part, &count) || count != parts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model is split into ", parts.size(), " files, so the output path must be a "
        "directory or end in -NNNNN-of-", absl::StrFormat("%05d", parts.size()), ".gguf, got '",
        output, "'"));
  }
  for (uint32_t k = 1; k <= count; ++k) dests.push_back(gguf::SplitPath(prefix, k, count));
  return dests;
}

}  // namespace

bool IsModelReference(std::string_view model) {
  return StartsWithNoCase(model, "http://") || StartsWithNoCase(model, "https://") ||
         StartsWithNoCase(model, "hf://");
}

absl::StatusOr<ModelReference> ParseModelReference(std::string_view ref,
                                                   std::string_view hf_endpoint) {
  const size_t sep = ref.find("://");
  if (sep == std::string_view::npos || !IsModelReference(ref)) {
    return BadReference(ref, "expected http://, https:// or hf://");
  }
  const std::string scheme = absl::AsciiStrToLower(Av(ref.substr(0, sep)));
  std::string_view rest = ref.substr(sep + 3);
  // A fragment is never sent to the server; "#member=PATH" names a member of the archive.
  std::string_view fragment;
  if (const size_t hash = rest.find('#'); hash != std::string_view::npos) {
    fragment = rest.substr(hash + 1);
    rest = rest.substr(0, hash);
  }
  auto out = scheme == "hf" ? ParseHf(ref, rest, hf_endpoint)
                            : ParseUrl(ref, scheme, rest, hf_endpoint);
  if (out.ok() && fragment.starts_with("member=")) {
    fragment.remove_prefix(7);
    if (auto member = PathSegments(ref, fragment); !member.ok()) return member.status();
    out->member = std::string(fragment);
  }
  return out;
}

std::vector<ModelReference> ModelParts(const ModelReference& ref) {
  std::string prefix;
  uint32_t part = 0, count = 0;
  if (!ref.member.empty() || !gguf::ParseSplitPath(ref.file, &prefix, &part, &count)) {
    return {ref};
  }
  std::vector<ModelReference> parts;
  for (uint32_t k = 1; k <= count; ++k) {
    parts.push_back(ref);
    parts.back().file = gguf::SplitPath(prefix, k, count);
  }
  return parts;
}

absl::StatusOr<std::string> ModelCacheDir() {
  const std::string cache = Env("FUCINA_CACHE");
  if (!cache.empty()) return cache + "/models";
  const std::string home = Env("HOME");
  if (!home.empty()) return home + "/.cache/fucina/models";
  return absl::FailedPreconditionError(
      "neither FUCINA_CACHE nor HOME is set: the model cache is $FUCINA_CACHE/models");
}

absl::StatusOr<std::string> PullModel(const std::string& ref, const PullOptions& options) {
  std::string endpoint = Env("HF_ENDPOINT");
  if (endpoint.empty()) endpoint = std::string(kDefaultHfEndpoint);
  auto parsed = ParseModelReference(ref, endpoint);
  if (!parsed.ok()) return parsed.status();
  std::string sha256 = absl::AsciiStrToLower(options.sha256);
  if (!sha256.empty() && (sha256.size() != 64 ||
                          !std::all_of(sha256.begin(), sha256.end(), absl::ascii_isxdigit))) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sha256 must be 64 hexadecimal digits, got '", options.sha256, "'"));
  }
  const std::vector<ModelReference> parts = ModelParts(*parsed);
  auto dests = Destinations(parts, options.output);
  if (!dests.ok()) return dests.status();
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool named = parts[i].file == parsed->file;
    const std::string expected = named ? sha256 : std::string();
    absl::Status s =
        parts[i].member.empty()
            ? FetchFile(parts[i].url(), (*dests)[i], parts[i].send_hf_token, expected,
                        options.progress)
            : FetchMember(parts[i].url(), parts[i].member, (*dests)[i], parts[i].send_hf_token,
                          expected, options.progress);
    if (!s.ok()) return s;
  }
  return dests->front();
}

absl::StatusOr<std::string> ResolveModel(const std::string& model, bool progress) {
  if (!IsModelReference(model)) return model;
  PullOptions options;
  options.progress = progress;
  return PullModel(model, options);
}

}  // namespace fucina
