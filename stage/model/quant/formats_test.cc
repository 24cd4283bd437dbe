// Each format's dequantization rule against its reference implementation: the packers here follow
// the reference code's packing (compressed-tensors pack_to_int32, AutoGPTQ QuantLinear.pack,
// AutoAWQ pack with order_map), known words pin the bit order, and the expected weights are the
// reference formulas written out element by element.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage/model/quant/awq.h"
#include "stage/model/quant/compressed_tensors.h"
#include "stage/model/quant/fp8_block.h"
#include "stage/model/quant/gptq.h"
#include "stage/model/quant/mxfp4.h"

namespace ringserve::quant {
namespace {

using ::testing::HasSubstr;

// Owns the bytes a QTensor views.
struct Stored {
  std::string bytes;
  QTensor tensor;
};

template <typename T>
Stored Store(std::string name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  Stored s;
  s.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  s.tensor =
      QTensor{.name = std::move(name), .dtype = dtype, .shape = std::move(shape), .bytes = {}};
  return s;
}

QTensor View(const Stored& s) {
  QTensor t = s.tensor;
  t.bytes = std::span(reinterpret_cast<const uint8_t*>(s.bytes.data()), s.bytes.size());
  return t;
}

// --- FP8 -------------------------------------------------------------------------------------

TEST(Fp8Test, ScalesEachBlockIncludingPartialEdgeBlocks) {
  // [5, 7] in blocks of [2, 3]: a 3 x 3 scale grid whose last row and column are partial.
  const int64_t rows = 5, cols = 7;
  std::vector<uint8_t> codes(rows * cols);
  const uint8_t palette[] = {0x38 /*1*/, 0x40 /*2*/, 0xb8 /*-1*/, 0x3c /*1.5*/, 0x01 /*2^-9*/};
  const float values[] = {1.0f, 2.0f, -1.0f, 1.5f, std::ldexp(1.0f, -9)};
  for (int64_t i = 0; i < rows * cols; ++i) codes[i] = palette[i % 5];
  std::vector<float> scales(9);
  for (int i = 0; i < 9; ++i) scales[i] = 0.25f * static_cast<float>(i + 1);
  const Stored w = Store("w.weight", DType::kF8E4M3, {rows, cols}, codes);
  const Stored s = Store("w.weight_scale_inv", DType::kF32, {3, 3}, scales);
  auto out = DequantizeFp8(View(w), View(s), {2, 3});
  ASSERT_TRUE(out.ok()) << out.status();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float want = values[(r * cols + c) % 5] * scales[(r / 2) * 3 + c / 3];
      EXPECT_EQ((*out)[r * cols + c], want) << r << "," << c;
    }
  }
}

TEST(Fp8Test, DeepSeekShapeWithOneColumnPastTheBlock) {
  // 3 x 130 in 128 x 128 blocks: scale grid [1, 2]; column 128 and 129 use the second scale.
  std::vector<uint8_t> codes(3 * 130, 0x38);  // all 1.0
  const Stored w = Store("w", DType::kF8E4M3, {3, 130}, codes);
  const Stored s = Store("s", DType::kF32, {1, 2}, std::vector<float>{0.5f, 3.0f});
  auto out = DequantizeFp8(View(w), View(s), {128, 128});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[127], 0.5f);
  EXPECT_EQ((*out)[128], 3.0f);
  EXPECT_EQ((*out)[2 * 130 + 129], 3.0f);
}

TEST(Fp8Test, Ue8m0ScalesAreExactPowersOfTwo) {
  const Stored w = Store("w", DType::kF8E4M3, {1, 2}, std::vector<uint8_t>{0x3c, 0xc0});  // 1.5, -2
  const Stored s = Store("s", DType::kF8E8M0, {1, 1}, std::vector<uint8_t>{124});         // 2^-3
  auto out = DequantizeFp8(View(w), View(s), {128, 128});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, ::testing::ElementsAre(1.5f / 8, -2.0f / 8));
}

TEST(Fp8Test, PerTensorAndPerChannelScales) {
  const Stored w = Store("w", DType::kF8E4M3, {2, 2}, std::vector<uint8_t>{0x38, 0x40, 0x38, 0x40});
  const Stored tensor_scale = Store("s", DType::kF32, {1}, std::vector<float>{0.5f});
  auto per_tensor = DequantizeFp8(View(w), View(tensor_scale), {2, 2});
  ASSERT_TRUE(per_tensor.ok()) << per_tensor.status();
  EXPECT_THAT(*per_tensor, ::testing::ElementsAre(0.5f, 1.0f, 0.5f, 1.0f));
  const Stored channel_scale = Store("s", DType::kF32, {2, 1}, std::vector<float>{1.0f, 4.0f});
  auto per_channel = DequantizeFp8(View(w), View(channel_scale), {1, 2});
  ASSERT_TRUE(per_channel.ok()) << per_channel.status();
  EXPECT_THAT(*per_channel, ::testing::ElementsAre(1.0f, 2.0f, 4.0f, 8.0f));
}

TEST(Fp8Test, RefusesFloorSizedScalesAndWrongDTypes) {
  const Stored w = Store("layer.weight", DType::kF8E4M3, {3, 130}, std::vector<uint8_t>(390));
  const Stored floor_sized =
      Store("layer.weight_scale_inv", DType::kF32, {1, 1}, std::vector<float>{1});
  auto bad = DequantizeFp8(View(w), View(floor_sized), {128, 128});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("layer.weight_scale_inv"));
  EXPECT_THAT(bad.status().message(), HasSubstr("[1, 2]"));
  const Stored int_scale =
      Store("layer.weight_scale_inv", DType::kI32, {1, 2}, std::vector<int32_t>{1, 1});
  EXPECT_FALSE(DequantizeFp8(View(w), View(int_scale), {128, 128}).ok());
  const Stored bf16_weight =
      Store("layer.weight", DType::kBF16, {1, 2}, std::vector<uint16_t>{0, 0});
  EXPECT_THAT(DequantizeFp8(View(bf16_weight), View(floor_sized), {128, 128}).status().message(),
              HasSubstr("F8_E4M3"));
}

// --- compressed-tensors ----------------------------------------------------------------------

// compressed_tensors pack_to_int32: shift to unsigned, pad, pack LSB-first along `packed_dim`.
std::vector<int32_t> PackToInt32(const std::vector<int8_t>& v, int64_t rows, int64_t cols, int bits,
                                 int packed_dim) {
  const int per_word = 32 / bits;
  const int64_t out_rows = packed_dim == 0 ? CeilDiv(rows, per_word) : rows;
  const int64_t out_cols = packed_dim == 1 ? CeilDiv(cols, per_word) : cols;
  std::vector<uint32_t> words(out_rows * out_cols, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t u = static_cast<uint32_t>(v[r * cols + c] + (1 << (bits - 1)));
      const int64_t k = packed_dim == 1 ? c : r;
      const int64_t word =
          packed_dim == 1 ? r * out_cols + k / per_word : (k / per_word) * cols + c;
      words[word] |= u << (bits * (k % per_word));
    }
  }
  std::vector<int32_t> out(words.size());
  std::memcpy(out.data(), words.data(), words.size() * 4);
  return out;
}

TEST(CompressedTensorsTest, UnpacksTheDocumentedExample) {
  // pack_to_int32's docstring: 8-bit [1, 2] -> [129, 130, 0, 0] -> 33409.
  EXPECT_EQ(PackToInt32({1, 2}, 1, 2, 8, 1), std::vector<int32_t>{33409});
  const Stored packed = Store("m.weight_packed", DType::kI32, {1, 1}, std::vector<int32_t>{33409});
  auto q = UnpackCompressedInt32(View(packed), 8, 1, 2, 1);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_THAT(*q, ::testing::ElementsAre(1, 2));
}

TEST(CompressedTensorsTest, UnpacksPaddedInt4AlongEitherDimension) {
  std::mt19937 rng(11);
  const int64_t rows = 5, cols = 12;  // 12 columns: the second word of each row is half padding
  std::vector<int8_t> v(rows * cols);
  for (auto& x : v) x = static_cast<int8_t>(static_cast<int>(rng() % 16) - 8);
  for (int dim : {0, 1}) {
    const std::vector<int32_t> words = PackToInt32(v, rows, cols, 4, dim);
    const std::vector<int64_t> shape =
        dim == 1 ? std::vector<int64_t>{rows, 2} : std::vector<int64_t>{1, cols};
    const Stored packed = Store("m.weight_packed", DType::kI32, shape, words);
    auto q = UnpackCompressedInt32(View(packed), 4, rows, cols, dim);
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(*q, v) << "packed_dim " << dim;
  }
  const Stored wrong = Store("m.weight_packed", DType::kI32, {rows, 1}, std::vector<int32_t>(5));
  auto bad = UnpackCompressedInt32(View(wrong), 4, rows, cols, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("m.weight_packed"));
}

TEST(CompressedTensorsTest, GroupRuleWithZeroPointsAndActivationOrder) {
  // W[r][c] = (q - zp[r][g]) * scale[r][g], g = g_idx[c] (the reference's dequantize with g_idx).
  const int64_t rows = 3, cols = 8, group = 4;
  std::vector<int8_t> q(rows * cols);
  std::iota(q.begin(), q.end(), -8);
  const std::vector<int64_t> g_idx = {1, 0, 1, 0, 0, 1, 1, 0};
  std::vector<float> scales = {0.5f, 2.0f, 0.25f, 1.0f, 4.0f, 0.125f};  // [3, 2]
  const std::vector<int8_t> zeros = {1, -2, 0, 3, -1, 2};
  const Stored s = Store("m.weight_scale", DType::kF32, {rows, 2}, scales);
  auto w = DequantizeCompressedInt(
      q, View(s),
      {.rows = rows, .cols = cols, .grid = {1, group}, .zero_points = zeros, .g_idx = g_idx});
  ASSERT_TRUE(w.ok()) << w.status();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = r * 2 + g_idx[c];
      EXPECT_EQ((*w)[r * cols + c], static_cast<float>(q[r * cols + c] - zeros[g]) * scales[g]);
    }
  }
  // Without g_idx the group of column c is c / group_size.
  auto plain = DequantizeCompressedInt(
      q, View(s), {.rows = rows, .cols = cols, .grid = {1, group}, .zero_points = {}, .g_idx = {}});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)[5], static_cast<float>(q[5]) * scales[1]);
  // A g_idx naming a group that does not exist is refused.
  auto bad = DequantizeCompressedInt(q, View(s),
                                     {.rows = rows,
                                      .cols = cols,
                                      .grid = {1, group},
                                      .zero_points = {},
                                      .g_idx = {0, 0, 0, 0, 0, 0, 0, 2}});
  EXPECT_FALSE(bad.ok());
  // A g_idx still holding its initial -1 means column order (the reference's is_column_order).
  auto initial = DequantizeCompressedInt(q, View(s),
                                         {.rows = rows,
                                          .cols = cols,
                                          .grid = {1, group},
                                          .zero_points = {},
                                          .g_idx = std::vector<int64_t>(cols, -1)});
  ASSERT_TRUE(initial.ok()) << initial.status();
  EXPECT_EQ(*initial, *plain);
}

// --- GPTQ ------------------------------------------------------------------------------------

struct GptqPacked {
  std::vector<int32_t> qweight, qzeros;
};

// AutoGPTQ QuantLinear.pack: qweight packs input rows, qzeros output columns, zeros stored - 1.
GptqPacked PackGptq(const std::vector<int>& q /*[in][out]*/, const std::vector<int>& z /*[G][out]*/,
                    int64_t in, int64_t out, int64_t groups, int bits, int zero_offset) {
  const int p = 32 / bits;
  std::vector<uint32_t> qw(in / p * out, 0), qz(groups * out / p, 0);
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t o = 0; o < out; ++o)
      qw[(i / p) * out + o] |= uint32_t(q[i * out + o]) << (bits * (i % p));
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      qz[g * (out / p) + o / p] |= (uint32_t(z[g * out + o] - zero_offset) & mask)
                                   << (bits * (o % p));
    }
  }
  GptqPacked packed;
  packed.qweight.resize(qw.size());
  packed.qzeros.resize(qz.size());
  std::memcpy(packed.qweight.data(), qw.data(), qw.size() * 4);
  std::memcpy(packed.qzeros.data(), qz.data(), qz.size() * 4);
  return packed;
}

TEST(GptqTest, PacksInputRowsLeastSignificantFirst) {
  // Input rows 0..7 of output column 0 hold 0..7: one word 0x76543210.
  std::vector<int> q(8 * 8, 0);
  for (int i = 0; i < 8; ++i) q[i * 8] = i;
  const GptqPacked p = PackGptq(q, std::vector<int>(8, 8), 8, 8, 1, 4, 1);
  EXPECT_EQ(static_cast<uint32_t>(p.qweight[0]), 0x76543210u);
  EXPECT_EQ(static_cast<uint32_t>(p.qzeros[0]), 0x77777777u);  // v1: symmetric zero 8 stored as 7
}

class GptqRuleTest : public ::testing::TestWithParam<int> {};

TEST_P(GptqRuleTest, MatchesTheReferenceFormulaWithDescActGroups) {
  const int bits = GetParam();
  const int64_t in = 32, out = 16, group_size = 8, groups = 4;
  std::mt19937 rng(bits);
  std::vector<int> q(in * out), z(groups * out);
  for (auto& x : q) x = static_cast<int>(rng() % (1u << bits));
  for (auto& x : z) x = 1 + static_cast<int>(rng() % ((1u << bits) - 1));  // v1 cannot store 0
  std::vector<uint16_t> scale_bits(groups * out);
  std::vector<float> scales(groups * out);
  for (size_t i = 0; i < scales.size(); ++i) {
    scale_bits[i] = FloatToHalf(0.01f * static_cast<float>(1 + rng() % 50));
    scales[i] = HalfToFloat(scale_bits[i]);
  }
  // desc_act: column i belongs to the group of its position in a permutation.
  std::vector<int32_t> perm(in);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> g_idx(in);
  for (int64_t k = 0; k < in; ++k) g_idx[perm[k]] = static_cast<int32_t>(k / group_size);

  const GptqPacked p = PackGptq(q, z, in, out, groups, bits, 1);
  const int per_word = 32 / bits;
  const Stored qweight = Store("m.qweight", DType::kI32, {in / per_word, out}, p.qweight);
  const Stored qzeros = Store("m.qzeros", DType::kI32, {groups, out / per_word}, p.qzeros);
  const Stored s = Store("m.scales", DType::kF16, {groups, out}, scale_bits);
  const Stored gi = Store("m.g_idx", DType::kI32, {in}, g_idx);
  const QTensor g_view = View(gi);
  auto w = DequantizeGptq(View(qweight), View(qzeros), View(s), &g_view,
                          {.out_features = out,
                           .in_features = in,
                           .bits = bits,
                           .group_size = static_cast<int>(group_size),
                           .zero_offset = 1});
  ASSERT_TRUE(w.ok()) << w.status();
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = g_idx[i];
      // AutoGPTQ: zeros = unpacked + 1; weight = scales * (q - zeros).
      const float want = scales[g * out + o] * static_cast<float>(q[i * out + o] - z[g * out + o]);
      ASSERT_EQ((*w)[o * in + i], want) << "o=" << o << " i=" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bits, GptqRuleTest, ::testing::Values(2, 4, 8));

TEST(GptqTest, V2ZerosHaveNoOffsetAndShapesAreChecked) {
  const int64_t in = 8, out = 8;
  std::vector<int> q(in * out, 5), z(out, 3);
  const GptqPacked p = PackGptq(q, z, in, out, 1, 4, 0);
  const Stored qweight = Store("m.qweight", DType::kI32, {1, out}, p.qweight);
  const Stored qzeros = Store("m.qzeros", DType::kI32, {1, 1}, p.qzeros);
  const Stored s =
      Store("m.scales", DType::kF16, {1, out}, std::vector<uint16_t>(out, FloatToHalf(1)));
  auto w = DequantizeGptq(
      View(qweight), View(qzeros), View(s), nullptr,
      {.out_features = out, .in_features = in, .bits = 4, .group_size = -1, .zero_offset = 0});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)[0], 2.0f);
  auto bad = DequantizeGptq(View(qweight), View(qzeros), View(s), nullptr,
                            {.out_features = out, .in_features = 16, .bits = 4, .group_size = -1});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("m.qweight"));
}

// --- AWQ -------------------------------------------------------------------------------------

// AutoAWQ pack: field k of word [i][j] holds column j * 8 + order_map[k].
std::vector<int32_t> PackAwq(const std::vector<int>& v /*[rows][cols]*/, int64_t rows,
                             int64_t cols) {
  std::vector<uint32_t> words(rows * cols / 8, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols / 8; ++j) {
      for (int k = 0; k < 8; ++k) {
        words[r * (cols / 8) + j] |= uint32_t(v[r * cols + j * 8 + kAwqOrder[k]]) << (4 * k);
      }
    }
  }
  std::vector<int32_t> out(words.size());
  std::memcpy(out.data(), words.data(), words.size() * 4);
  return out;
}

TEST(AwqTest, PackOrderInterleavesEvenAndOddColumns) {
  // Columns 0..7 hold 0..7: fields hold columns 0,2,4,6,1,3,5,7 -> 0x75316420.
  const std::vector<int32_t> word = PackAwq({0, 1, 2, 3, 4, 5, 6, 7}, 1, 8);
  EXPECT_EQ(static_cast<uint32_t>(word[0]), 0x75316420u);
  const Stored qweight = Store("m.qweight", DType::kI32, {1, 1}, word);
  const Stored qzeros = Store("m.qzeros", DType::kI32, {1, 1}, std::vector<int32_t>{0});
  const Stored s = Store("m.scales", DType::kF16, {1, 8}, std::vector<uint16_t>(8, FloatToHalf(1)));
  auto w = DequantizeAwq(View(qweight), View(qzeros), View(s),
                         {.out_features = 8, .in_features = 1, .group_size = 128});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(*w, ::testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));  // W[o][0] = o
}

TEST(AwqTest, MatchesTheReferenceFormula) {
  const int64_t in = 16, out = 16, group_size = 8, groups = 2;
  std::mt19937 rng(5);
  std::vector<int> q(in * out), z(groups * out);
  for (auto& x : q) x = static_cast<int>(rng() % 16);
  for (auto& x : z) x = static_cast<int>(rng() % 16);
  std::vector<uint16_t> scale_bits(groups * out);
  for (auto& b : scale_bits) b = FloatToHalf(0.02f * static_cast<float>(1 + rng() % 30));
  const Stored qweight = Store("m.qweight", DType::kI32, {in, out / 8}, PackAwq(q, in, out));
  const Stored qzeros = Store("m.qzeros", DType::kI32, {groups, out / 8}, PackAwq(z, groups, out));
  const Stored s = Store("m.scales", DType::kF16, {groups, out}, scale_bits);
  auto w = DequantizeAwq(View(qweight), View(qzeros), View(s),
                         {.out_features = out, .in_features = in, .group_size = 8});
  ASSERT_TRUE(w.ok()) << w.status();
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = i / group_size;
      const float want = static_cast<float>(q[i * out + o] - z[g * out + o]) *
                         HalfToFloat(scale_bits[g * out + o]);
      ASSERT_EQ((*w)[o * in + i], want) << o << "," << i;
    }
  }
}

// --- MXFP4 -----------------------------------------------------------------------------------

TEST(Mxfp4Test, LowNibbleFirstAndE8M0BlockScale) {
  std::vector<uint8_t> blocks(2 * 16, 0);
  blocks[0] = 0x21;   // low 1 (+0.5), high 2 (+1.0)
  blocks[1] = 0xf8;   // low 8 (-0.0), high 15 (-6.0)
  blocks[16] = 0x77;  // second block: +6.0, +6.0
  const Stored b = Store("experts.down_proj_blocks", DType::kU8, {1, 2, 16}, blocks);
  const Stored s =
      Store("experts.down_proj_scales", DType::kU8, {1, 2}, std::vector<uint8_t>{128, 125});
  auto out = DequantizeMxfp4(View(b), View(s));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 64u);
  EXPECT_EQ((*out)[0], 1.0f);  // 0.5 * 2
  EXPECT_EQ((*out)[1], 2.0f);
  EXPECT_EQ((*out)[2], 0.0f);
  EXPECT_TRUE(std::signbit((*out)[2]));
  EXPECT_EQ((*out)[3], -12.0f);
  EXPECT_EQ((*out)[32], 1.5f);  // 6 * 2^-2
  EXPECT_EQ((*out)[33], 1.5f);
  const Stored bad_scales =
      Store("experts.down_proj_scales", DType::kU8, {2}, std::vector<uint8_t>{1, 1});
  auto bad = DequantizeMxfp4(View(b), View(bad_scales));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("experts.down_proj_scales"));
}

}  // namespace
}  // namespace ringserve::quant
