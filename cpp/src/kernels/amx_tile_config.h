// AMX tile configuration shared by the amx GEMM (packed_gemm_amx.cpp) and the amx attention
// fold (attention_amx.h): palette 1, eight tiles, each 16 rows of 64 bytes unless the caller
// reshapes some before loading it.
//
// Include it inside an AMX target region, after every system header: its function is compiled for
// those instructions, each source its own copy (anonymous namespace), as packed_gemm_store.h.
#pragma once

namespace corellm::amx_tiles {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile t
  uint8_t rows[16];    // rows of tile t
};

// Every tile 16 rows x 64 bytes (16 fp32, or 16 bf16 pairs, per row).
inline TileConfig uniform_config() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

// Loads cfg as the calling thread's tile configuration. Through asm whose operand is the whole
// 64-byte object: with _tile_loadconfig(&cfg), GCC did not count the builtin as reading all of cfg,
// and in one inlining (the attention fold's, in a version that folded a tile of rows at a time,
// not kept) dropped the stores of colsb, so that LDTILECFG met zero-width tiles and faulted (#GP,
// a SIGSEGV).
inline void load_amx_config(const TileConfig& cfg) { asm volatile("ldtilecfg %0" : : "m"(cfg)); }

}  // namespace
}  // namespace corellm::amx_tiles
