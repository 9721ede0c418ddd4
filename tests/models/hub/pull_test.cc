// Model references: hf:// and URL mapping, cache paths, split-part naming, the cache directory,
// and errors that need no server (a refused connection, bad arguments). Fetching from a server
// is covered end to end by tests/tools/pull_cli_test.py.
#include "models/hub/pull.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/models/gguf/gguf_test_util.h"

namespace fucina {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr std::string_view kHf = "https://huggingface.co";

// Sets an environment variable for one scope and restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value == nullptr) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

ModelReference Parse(std::string_view ref, std::string_view endpoint = kHf) {
  auto parsed = ParseModelReference(ref, endpoint);
  EXPECT_TRUE(parsed.ok()) << ref << ": " << parsed.status();
  return parsed.ok() ? *parsed : ModelReference{};
}

TEST(ModelReferenceTest, WhatCountsAsAReference) {
  EXPECT_TRUE(IsModelReference("https://example.com/m.gguf"));
  EXPECT_TRUE(IsModelReference("http://example.com/m.gguf"));
  EXPECT_TRUE(IsModelReference("hf://org/repo/m.gguf"));
  EXPECT_TRUE(IsModelReference("HF://org/repo/m.gguf"));
  EXPECT_FALSE(IsModelReference("m.gguf"));
  EXPECT_FALSE(IsModelReference("/models/m.gguf"));
  EXPECT_FALSE(IsModelReference("hf:/org/repo/m.gguf"));
  EXPECT_FALSE(IsModelReference("ftp://example.com/m.gguf"));
}

TEST(ModelReferenceTest, HfMapsToResolveUrlAndRevisionedCachePath) {
  const ModelReference r = Parse("hf://Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf");
  EXPECT_EQ(r.url(),
            "https://huggingface.co/Qwen/Qwen3-0.6B-GGUF/resolve/main/Qwen3-0.6B-Q8_0.gguf");
  EXPECT_EQ(r.cache_path(), "hf/Qwen/Qwen3-0.6B-GGUF/main/Qwen3-0.6B-Q8_0.gguf");
  EXPECT_TRUE(r.send_hf_token);
}

TEST(ModelReferenceTest, HfEndpointRevisionAndSubfolder) {
  const ModelReference r = Parse("hf://org/repo/q4/sub/m.gguf@v1.0", "http://127.0.0.1:8080/");
  EXPECT_EQ(r.url(), "http://127.0.0.1:8080/org/repo/resolve/v1.0/q4/sub/m.gguf");
  // The endpoint is not part of the cache path: a mirror serves the same repositories.
  EXPECT_EQ(r.cache_path(), "hf/org/repo/v1.0/q4/sub/m.gguf");
  EXPECT_EQ(Parse("hf://org/repo/m.gguf@0123abcd").url(),
            "https://huggingface.co/org/repo/resolve/0123abcd/m.gguf");
}

TEST(ModelReferenceTest, UrlCachePathUsesHostPortAndPath) {
  ModelReference r = Parse("https://Example.COM/a/b/m.gguf?download=true#frag");
  EXPECT_EQ(r.url(), "https://Example.COM/a/b/m.gguf?download=true");
  EXPECT_EQ(r.cache_path(), "example.com/a/b/m.gguf");
  EXPECT_FALSE(r.send_hf_token);
  EXPECT_EQ(Parse("http://127.0.0.1:8080/m.gguf").cache_path(), "127.0.0.1_8080/m.gguf");
  EXPECT_EQ(Parse("http://host:80/m.gguf").cache_path(), "host/m.gguf");
  EXPECT_EQ(Parse("https://host:443/m.gguf").cache_path(), "host/m.gguf");
  EXPECT_EQ(Parse("https://host:80/m.gguf").cache_path(), "host_80/m.gguf");
  EXPECT_EQ(Parse("http://user:secret@[::1]:9000/d/m.gguf").cache_path(), "__1_9000/d/m.gguf");
  EXPECT_EQ(Parse("http://user:secret@[::1]:9000/d/m.gguf").url(),
            "http://user:secret@[::1]:9000/d/m.gguf");
  // Plain URLs on the Hugging Face host carry the token too.
  EXPECT_TRUE(Parse("https://huggingface.co/org/repo/resolve/main/m.gguf").send_hf_token);
}

TEST(ModelReferenceTest, ArchiveMemberFragment) {
  const ModelReference r = Parse(
      "https://files.example/p/06/be/pkg-0.1.2-py3-none-any.whl#member=pkg/M.Q4_1.gguf");
  // The archive is what is fetched; the member is what lands in the cache.
  EXPECT_EQ(r.url(), "https://files.example/p/06/be/pkg-0.1.2-py3-none-any.whl");
  EXPECT_EQ(r.member, "pkg/M.Q4_1.gguf");
  EXPECT_EQ(r.local_name(), "M.Q4_1.gguf");
  EXPECT_EQ(r.cache_path(),
            "files.example/p/06/be/pkg-0.1.2-py3-none-any.whl.members/pkg/M.Q4_1.gguf");
  EXPECT_EQ(ModelParts(r).size(), 1u);
  // Other fragments (pip's #sha256=...) are still never sent and name no member.
  const ModelReference plain = Parse("https://h/pkg.whl#sha256=00ff");
  EXPECT_EQ(plain.member, "");
  EXPECT_EQ(plain.url(), "https://h/pkg.whl");
  EXPECT_EQ(plain.cache_path(), "h/pkg.whl");
  const ModelReference hf = Parse("hf://org/repo/dist/pkg.whl@v1#member=pkg/m.gguf");
  EXPECT_EQ(hf.url(), "https://huggingface.co/org/repo/resolve/v1/dist/pkg.whl");
  EXPECT_EQ(hf.cache_path(), "hf/org/repo/v1/dist/pkg.whl.members/pkg/m.gguf");
  for (const char* bad : {"https://h/pkg.whl#member=", "https://h/pkg.whl#member=../../x.gguf",
                          "hf://org/repo/pkg.whl#member=/x.gguf",
                          "https://h/pkg.whl#member=a//x.gguf", "https://h/pkg.whl#member=x/"}) {
    auto parsed = ParseModelReference(bad, kHf);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("path segments"));
  }
}

TEST(ModelReferenceTest, MalformedReferencesNameTheProblem) {
  struct Case {
    const char* ref;
    const char* message;
  };
  for (const Case& c : {
           Case{"hf://org/repo", "hf://ORG/REPO/FILE"},
           Case{"hf://org/m.gguf", "hf://ORG/REPO/FILE"},
           Case{"hf://org/repo/../../etc/m.gguf", "'..'"},
           Case{"hf://org//repo/m.gguf", "empty"},
           Case{"hf://org/repo/m.gguf@", "revision"},
           Case{"hf://org/repo/m.gguf@refs/pr/1", "revision"},
           Case{"https://example.com/", "names no file"},
           Case{"https://example.com", "names no file"},
           Case{"https://example.com/a/./m.gguf", "'.'"},
           Case{"https://example.com/a/", "empty"},
           Case{"https://:8080/m.gguf", "no host"},
           Case{"https://host:x/m.gguf", "port"},
           Case{"ftp://host/m.gguf", "http://, https:// or hf://"},
       }) {
    auto r = ParseModelReference(c.ref, kHf);
    ASSERT_FALSE(r.ok()) << c.ref;
    EXPECT_THAT(r.status().message(), AllOf(HasSubstr(c.ref), HasSubstr(c.message)));
  }
  auto r = ParseModelReference("hf://org/repo/m.gguf", "huggingface.co");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("HF_ENDPOINT"), HasSubstr("huggingface.co")));
}

TEST(ModelReferenceTest, SplitGgufListsEveryPartFromTheSameBase) {
  const ModelReference r = Parse("hf://org/repo/big-00002-of-00003.gguf@rev");
  const std::vector<ModelReference> parts = ModelParts(r);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].url(), "https://huggingface.co/org/repo/resolve/rev/big-00001-of-00003.gguf");
  EXPECT_EQ(parts[1].url(), "https://huggingface.co/org/repo/resolve/rev/big-00002-of-00003.gguf");
  EXPECT_EQ(parts[2].cache_path(), "hf/org/repo/rev/big-00003-of-00003.gguf");

  const std::vector<ModelReference> url_parts =
      ModelParts(Parse("http://h/d/m-00001-of-00002.gguf?x=1"));
  ASSERT_EQ(url_parts.size(), 2u);
  EXPECT_EQ(url_parts[1].url(), "http://h/d/m-00002-of-00002.gguf?x=1");

  EXPECT_EQ(ModelParts(Parse("http://h/m-1-of-3.gguf")).size(), 1u);
  EXPECT_EQ(ModelParts(Parse("http://h/m-00004-of-00003.gguf")).size(), 1u);
}

TEST(ModelCacheDirTest, FucinaCacheThenHome) {
  {
    ScopedEnv cache("FUCINA_CACHE", "/tmp/fc");
    EXPECT_EQ(*ModelCacheDir(), "/tmp/fc/models");
  }
  ScopedEnv cache("FUCINA_CACHE", nullptr);
  {
    ScopedEnv home("HOME", "/home/u");
    EXPECT_EQ(*ModelCacheDir(), "/home/u/.cache/fucina/models");
  }
  ScopedEnv home("HOME", nullptr);
  auto dir = ModelCacheDir();
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(dir.status().message(), HasSubstr("FUCINA_CACHE"));
}

TEST(ResolveModelTest, LocalPathsAreReturnedUnchanged) {
  ScopedEnv cache("FUCINA_CACHE", "/nonexistent");
  EXPECT_EQ(*ResolveModel("models/m.gguf", false), "models/m.gguf");
  EXPECT_EQ(*ResolveModel("/abs/hf:/m.gguf", false), "/abs/hf:/m.gguf");
}

TEST(PullModelTest, RefusedConnectionNamesTheUrlAndLeavesNoFile) {
  gguf::testing::ScratchDir dir;
  ScopedEnv cache("FUCINA_CACHE", dir.File("cache").c_str());
  // Port 1 (tcpmux) is privileged and unused: the connection is refused at once.
  auto path = ResolveModel("http://127.0.0.1:1/m.gguf", false);
  ASSERT_FALSE(path.ok());
  EXPECT_THAT(path.status().message(),
              AllOf(HasSubstr("http://127.0.0.1:1/m.gguf"), HasSubstr("failed")));
  EXPECT_FALSE(std::filesystem::exists(dir.File("cache/models/127.0.0.1_1/m.gguf")));
}

TEST(PullModelTest, BadChecksumArgumentAndSplitOutputName) {
  gguf::testing::ScratchDir dir;
  PullOptions options;
  options.sha256 = "abc";
  auto path = PullModel("http://127.0.0.1:1/m.gguf", options);
  ASSERT_FALSE(path.ok());
  EXPECT_THAT(path.status().message(), AllOf(HasSubstr("64 hexadecimal"), HasSubstr("'abc'")));

  options.sha256.clear();
  options.output = dir.File("model.gguf");
  path = PullModel("http://127.0.0.1:1/m-00001-of-00003.gguf", options);
  ASSERT_FALSE(path.ok());
  EXPECT_THAT(path.status().message(), AllOf(HasSubstr("-of-00003.gguf"), HasSubstr("model.gguf")));
}

}  // namespace
}  // namespace fucina
