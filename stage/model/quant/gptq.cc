#include "stage/model/quant/gptq.h"

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::quant {

int64_t GptqNumGroups(int64_t in_features, int group_size) {
  return group_size <= 0 ? 1 : CeilDiv(in_features, group_size);
}

absl::StatusOr<std::vector<float>> DequantizeGptq(const QTensor& qweight, const QTensor& qzeros,
                                                  const QTensor& scales, const QTensor* g_idx,
                                                  const GptqArgs& args) {
  if (args.bits != 2 && args.bits != 4 && args.bits != 8) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\": GPTQ bits {} is not supported (2, 4 or 8)", qweight.name, args.bits));
  }
  const int per_word = 32 / args.bits;
  const int64_t out = args.out_features, in = args.in_features;
  if (in % per_word != 0 || out % per_word != 0) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\": a [{}, {}] layer does not pack into words of {} {}-bit values",
                    qweight.name, out, in, per_word, args.bits));
  }
  const int64_t groups = GptqNumGroups(in, args.group_size);
  RS_RETURN_IF_ERROR(CheckDType(qweight, {DType::kI32}));
  RS_RETURN_IF_ERROR(CheckDType(qzeros, {DType::kI32}));
  RS_RETURN_IF_ERROR(CheckShape(qweight, std::vector<int64_t>{in / per_word, out}));
  RS_RETURN_IF_ERROR(CheckShape(qzeros, std::vector<int64_t>{groups, out / per_word}));
  RS_RETURN_IF_ERROR(CheckShape(scales, std::vector<int64_t>{groups, out}));
  RS_ASSIGN_OR_RETURN(std::vector<float> scale, ReadScales(scales));
  std::vector<int64_t> group(static_cast<size_t>(in));
  if (g_idx != nullptr) {
    RS_RETURN_IF_ERROR(CheckShape(*g_idx, std::vector<int64_t>{in}));
    RS_ASSIGN_OR_RETURN(group, ReadIntegers(*g_idx));
    for (int64_t i = 0; i < in; ++i) {
      if (group[i] < 0 || group[i] >= groups) {
        return absl::InvalidArgumentError(
            fmt::format("tensor \"{}\": entry {} names group {}, outside [0, {})", g_idx->name, i,
                        group[i], groups));
      }
    }
  } else {
    for (int64_t i = 0; i < in; ++i) group[i] = args.group_size <= 0 ? 0 : i / args.group_size;
  }
  // z + offset per (group, output), as fp32 (small integers: exact).
  std::vector<float> zero(static_cast<size_t>(groups * out));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      const uint32_t z = Field(LoadWord(qzeros.bytes, g * (out / per_word) + o / per_word),
                               args.bits, static_cast<int>(o % per_word));
      zero[g * out + o] = static_cast<float>(static_cast<int>(z) + args.zero_offset);
    }
  }
  // One packed word holds per_word consecutive inputs of one output: W[o][i..i+per_word) is a
  // contiguous run, so walk the words row by row of qweight and write each run at once.
  std::vector<float> w(static_cast<size_t>(out * in));
  for (int64_t word_row = 0; word_row < in / per_word; ++word_row) {
    const int64_t i0 = word_row * per_word;
    for (int64_t o = 0; o < out; ++o) {
      const uint32_t word = LoadWord(qweight.bytes, word_row * out + o);
      float* dst = w.data() + o * in + i0;
      for (int k = 0; k < per_word; ++k) {
        const int64_t at = group[i0 + k] * out + o;
        dst[k] = scale[at] * (static_cast<float>(Field(word, args.bits, k)) - zero[at]);
      }
    }
  }
  return w;
}

}  // namespace ringserve::quant
