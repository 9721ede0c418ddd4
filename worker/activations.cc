#include "worker/activations.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/fp16.h"

namespace fucina {


int64_t ActivationRowBytes(wire::ActivationType type, int64_t hidden) {
  switch (type) {
    case wire::ACTIVATION_F32:
      return hidden * 4;
    case wire::ACTIVATION_F16:
    case wire::ACTIVATION_BF16:
      return hidden * 2;
    default:
      return -1;
  }
}

void EncodeActivations(const float* x, int64_t rows, int64_t hidden, wire::ActivationType type,
                       wire::Activations* out) {
  const int64_t n = rows * hidden;
  out->set_type(type);
  out->set_rows(rows);
  out->set_hidden(hidden);
  std::string* data = out->mutable_data();
  data->resize(static_cast<size_t>(rows * ActivationRowBytes(type, hidden)));
  if (type == wire::ACTIVATION_F32) {
    std::memcpy(data->data(), x, n * sizeof(float));
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(data->data());
  for (int64_t i = 0; i < n; ++i) {
    h[i] = type == wire::ACTIVATION_F16 ? Fp32ToFp16(x[i]) : Fp32ToBf16(x[i]);
  }
}

absl::Status DecodeActivations(const wire::Activations& in, int64_t rows, int64_t hidden,
                               float* x) {
  const int64_t row_bytes = ActivationRowBytes(in.type(), hidden);
  if (row_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown activation type ", in.type()));
  }
  if (in.hidden() != hidden || in.rows() != rows) {
    return absl::InvalidArgumentError(absl::StrCat("activations are [", in.rows(), " x ",
                                                   in.hidden(), "], expected [", rows, " x ",
                                                   hidden, "]"));
  }
  if (static_cast<int64_t>(in.data().size()) != rows * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("activation data has ", in.data().size(),
                                                   " bytes, expected ", rows * row_bytes,
                                                   " for [", rows, " x ", hidden, "]"));
  }
  const int64_t n = rows * hidden;
  if (in.type() == wire::ACTIVATION_F32) {
    std::memcpy(x, in.data().data(), n * sizeof(float));
    return absl::OkStatus();
  }
  const auto* h = reinterpret_cast<const uint16_t*>(in.data().data());
  for (int64_t i = 0; i < n; ++i) {
    x[i] = in.type() == wire::ACTIVATION_F16 ? Fp16ToFp32(h[i]) : Bf16ToFp32(h[i]);
  }
  return absl::OkStatus();
}

absl::Status ParseActivationType(const std::string& name, wire::ActivationType* type) {
  if (name == "f32") {
    *type = wire::ACTIVATION_F32;
  } else if (name == "f16") {
    *type = wire::ACTIVATION_F16;
  } else if (name == "bf16") {
    *type = wire::ACTIVATION_BF16;
  } else {
    return absl::InvalidArgumentError("activation type must be f32, f16 or bf16, got '" + name +
                                      "'");
  }
  return absl::OkStatus();
}

}  // namespace fucina
