// P V and the driver of the widened span folds (attention_span_avx2.h, attention_span_avx512.h),
// written once: each includes this file inside its own namespace and target region, at its end
// (after its widen_queries, span_scores, softmax_row and for_row_blocks), after defining for its
// vectors of kLanes fp32 lanes: V, load / store (kLanes floats), mul, fmadd (a b + c), splat (a
// value on every lane), broadcast (the float at p on every lane), load_pairs (2 kLanes bf16) and
// widen_low / widen_high (a pair's first / second bf16 as fp32). No include guard and no
// includes: the includer provides them, TileRows, Span, TileScratch and kSpanKeys first.
//
// acc = acc * correction + P V for rows [r0, r0 + R), over the 16-key groups [g_begin, g_end),
// 2 kLanes dims at a time. Per key pair, those dims' values are loaded and widened (4 registers),
// then each row's two probabilities are broadcast once and used on both halves: 2R sums + 4 + 2
// registers. Per dim, one chain over the key pairs in order (key 2j, then 2j + 1). Past the
// sequence's last written key, the values are never read (a never-written slot may hold a stale
// NaN, which a zero probability would not cancel).
template <int HD, int R>
void span_values(const TileRows& rows, const Span& span, int64_t r0, int64_t g_begin, int64_t g_end,
                 const TileScratch& sc) {
  constexpr int kDims = 2 * kLanes;  // dims per pass
  const float* p = sc.s + r0 * kSpanKeys;
  for (int c = 0; c < HD / kDims; ++c) {
    V acc[R][2];
    for (int r = 0; r < R; ++r) {
      const V correction = splat(sc.correction[r0 + r]);
      const float* a = rows.acc + (r0 + r) * HD + kDims * c;
      acc[r][0] = mul(load(a), correction);
      acc[r][1] = mul(load(a + kLanes), correction);
    }
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t written = std::min<int64_t>(16, span.valid_end - (span.t0 + 16 * g));  // >= 1
      const uint16_t* vv = span.v[g] + 2 * kDims * c;
      for (int j = 0; 2 * j < written; ++j) {
        if (span.next != nullptr) span.next->step();
        const auto lo = load_pairs(vv + j * HD * 2), hi = load_pairs(vv + j * HD * 2 + 2 * kLanes);
        const int key = static_cast<int>(16 * g) + 2 * j;
        if (2 * j + 1 < written) {
          const V even0 = widen_low(lo), odd0 = widen_high(lo), even1 = widen_low(hi), odd1 = widen_high(hi);
          for (int r = 0; r < R; ++r) {
            const V pe = broadcast(p + r * kSpanKeys + key);
            const V po = broadcast(p + r * kSpanKeys + key + 1);
            acc[r][0] = fmadd(po, odd0, fmadd(pe, even0, acc[r][0]));
            acc[r][1] = fmadd(po, odd1, fmadd(pe, even1, acc[r][1]));
          }
        } else {  // the pair's second key was never written
          const V even0 = widen_low(lo), even1 = widen_low(hi);
          for (int r = 0; r < R; ++r) {
            const V pe = broadcast(p + r * kSpanKeys + key);
            acc[r][0] = fmadd(pe, even0, acc[r][0]);
            acc[r][1] = fmadd(pe, even1, acc[r][1]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float* a = rows.acc + (r0 + r) * HD + kDims * c;
      store(a, acc[r][0]);
      store(a + kLanes, acc[r][1]);
    }
  }
}

// Folds the span into every row that sees a key of it, a block of rows at a time from their
// scores to their values (the block's K and V stay in L1 between the two).
template <int HD>
void fold_span_bf16(const TileRows& rows, const Span& span, int64_t bs, ScoreScaling scaling, const TileScratch& sc) {
  const auto [r_begin, r_end, key_lo, key_hi] = span_reach(rows, span);
  if (r_end <= r_begin) return;
  for_row_blocks(r_begin, r_end, [&](auto rows_in_block, int64_t r0) {
    constexpr int R = decltype(rows_in_block)::value;
    const SpanReach reach = span_reach_of_rows(rows, span, r0, r0 + R);
    if (reach.r_end <= reach.r_begin) return;  // no row of the block sees the span
    const int64_t g_begin = reach.key_lo / 16, g_end = (reach.key_hi + 15) / 16;
    float q[R][HD];
    widen_queries<HD, R>(rows, r0, q);
    span_scores<HD, R>(q, span, bs, g_begin, g_end, sc.s + r0 * kSpanKeys);
    for (int64_t r = r0; r < r0 + R; ++r) softmax_row(rows, span, r, scaling, sc);
    span_values<HD, R>(rows, span, r0, g_begin, g_end, sc);
  });
}
