// A 4-layer Qwen3-shaped GGUF fixture (random weights) for the worker tests, and the shard and
// segment messages they send about it.
#ifndef FUCINA_TESTS_WORKER_FIXTURE_MODEL_H_
#define FUCINA_TESTS_WORKER_FIXTURE_MODEL_H_

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/fixture.h"
#include "worker/sampling_wire.h"
#include "worker/worker_client.h"

namespace fucina {

class FixtureModelTest : public testing::Test {
 protected:
  // Writes the fixture under the test temp folder (`tag` names the file). `init_std` 0.3
  // makes every layer change the output, so a shard missing a tensor shows.
  static void MakeModel(const std::string& tag, double init_std = 0.02) {
    path_ = new std::string(testing::TempDir() + "/" + tag + "_" + std::to_string(getpid()) +
                            ".gguf");
    FixtureOptions o;
    o.arch = "qwen3";
    o.num_layers = kLayers;
    o.init_std = init_std;
    ThreadPool pool(1);
    ASSERT_TRUE(MakeFixture(o, *path_, pool).ok());
  }
  static void RemoveModel() {
    std::remove(path_->c_str());
    delete path_;
    path_ = nullptr;
  }

  // Layers [first, last) of the fixture; 32 positions of f32 KV per session.
  static wire::LoadShardRequest Shard(int stage, int64_t first, int64_t last, bool emb,
                                      bool head) {
    wire::LoadShardRequest r;
    r.set_model_path(*path_);
    r.set_stage(stage);
    r.set_first_layer(first);
    r.set_last_layer(last);
    r.set_embeddings(emb);
    r.set_head(head);
    r.set_context(32);
    r.set_cache_type("f32");
    return r;
  }

  // A step of `ids` for `session` at `pos0`; greedy sampling when `sample`.
  static wire::Segment Seg(uint64_t session, int64_t pos0, std::vector<int32_t> ids,
                           bool sample = true) {
    wire::Segment s;
    s.set_session_id(session);
    s.set_pos0(pos0);
    for (int32_t id : ids) s.add_token_ids(id);
    if (sample) {
      SamplingParams greedy;
      greedy.temperature = 0;
      *s.mutable_sampling() = SamplingToWire(greedy);
    }
    return s;
  }

  // Session operations, as a step carries them.
  static wire::SessionOp TruncateOp(uint64_t session, int64_t length) {
    wire::SessionOp op;
    op.mutable_truncate()->set_session_id(session);
    op.mutable_truncate()->set_length(length);
    return op;
  }
  static wire::SessionOp CopyOp(uint64_t from, uint64_t to, int64_t length) {
    wire::SessionOp op;
    op.mutable_copy_prefix()->set_from_session(from);
    op.mutable_copy_prefix()->set_to_session(to);
    op.mutable_copy_prefix()->set_length(length);
    return op;
  }
  static wire::SessionOp ReleaseOp(uint64_t session) {
    wire::SessionOp op;
    op.mutable_release()->set_session_id(session);
    return op;
  }
  // A step of stage `stage` carrying only `ops`.
  static wire::ForwardRequest OpsStep(int stage, std::vector<wire::SessionOp> ops) {
    wire::ForwardRequest f;
    f.set_stage(stage);
    for (wire::SessionOp& op : ops) *f.add_session_ops() = std::move(op);
    return f;
  }

  static constexpr int64_t kLayers = 4;
  static inline std::string* path_ = nullptr;
};

}  // namespace fucina

#endif  // FUCINA_TESTS_WORKER_FIXTURE_MODEL_H_
