#include "bench/bench_model.h"

#include <utility>

#include "models/hub/pull.h"

namespace fucina::cli {

absl::StatusOr<std::vector<int32_t>> BenchModel::EncodeUserTurn(const std::string& user) const {
  std::string text = user;
  if (chat.ok()) {
    ChatMessage message;
    message.role = "user";
    message.content = user;
    auto rendered = chat->Render({message}, ChatRenderOptions());
    if (!rendered.ok()) return rendered.status();
    text = *std::move(rendered);
  }
  return tokenizer->Encode(text, !chat.ok(), true);
}

absl::StatusOr<BenchModel> LoadBenchModel(const std::string& reference, int threads) {
  BenchModel b;
  auto path = ResolveModel(reference, /*progress=*/false);
  if (!path.ok()) return path.status();
  b.path = *std::move(path);
  b.pool = std::make_unique<ThreadPool>(threads > 0 ? threads
                                                    : ThreadPool::Default().num_threads());
  auto model = Model::Load(b.path, {}, *b.pool);
  if (!model.ok()) return model.status();
  b.model = *std::move(model);
  auto tokenizer = Tokenizer::FromGguf(b.model->file());
  if (!tokenizer.ok()) return tokenizer.status();
  b.tokenizer = *std::move(tokenizer);
  b.chat = ChatTemplate::FromGguf(b.model->file());
  return b;
}

}  // namespace fucina::cli
