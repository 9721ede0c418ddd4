// A gtest fixture over the real SmolLM2 model (FUCINA_DEFAULT_MODEL): the model and its
// tokenizer, loaded once per test suite; every test skips when the variable is unset.
#ifndef FUCINA_TESTS_MODELS_SMOLLM2_FIXTURE_H_
#define FUCINA_TESTS_MODELS_SMOLLM2_FIXTURE_H_

#include <cstdlib>

#include <gtest/gtest.h>

#include "models/engine/model.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina {

class SmolLm2Test : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("FUCINA_DEFAULT_MODEL");
    if (path == nullptr) return;
    pool_ = new ThreadPool(2);
    auto model = Model::Load(path, {}, *pool_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    auto tok = Tokenizer::FromGguf(model_->file());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
    delete pool_;
    tokenizer_ = nullptr;
    model_ = nullptr;
    pool_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "FUCINA_DEFAULT_MODEL (the SmolLM2 GGUF) unset";
  }

  static inline ThreadPool* pool_ = nullptr;
  static inline Model* model_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
};

}  // namespace fucina

#endif  // FUCINA_TESTS_MODELS_SMOLLM2_FIXTURE_H_
