// Keyed SHA-256 chain hashing of full KV blocks (OpenSSL EVP, one reused digest context).
#include "corellm/prefix_hash.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "corellm/check.h"

namespace corellm {

std::string BlockHash::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = digits[bytes[i] >> 4];
    s[2 * i + 1] = digits[bytes[i] & 15];
  }
  return s;
}

struct PrefixHasher::Impl {
  EVP_MD* md = nullptr;
  EVP_MD_CTX* ctx = nullptr;
  Impl() {
    md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    ctx = EVP_MD_CTX_new();
    CORELLM_CHECK(md != nullptr && ctx != nullptr, "OpenSSL could not provide SHA-256");
  }
  ~Impl() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
};

static BlockHash random_root() {
  BlockHash root;
  CORELLM_CHECK(RAND_bytes(root.bytes.data(), static_cast<int>(root.bytes.size())) == 1,
                "OpenSSL RAND_bytes failed");
  return root;
}

PrefixHasher::PrefixHasher() : PrefixHasher(random_root()) {}

PrefixHasher::PrefixHasher(const BlockHash& root) : root_(root), impl_(new Impl()) {}

PrefixHasher::~PrefixHasher() { delete impl_; }

BlockHash PrefixHasher::hash_block(const BlockHash& parent, const int32_t* token_ids,
                                   size_t num_tokens, std::string_view extra_keys) const {
  static_assert(sizeof(int32_t) == 4, "token ids are hashed as 4-byte little-endian values");
  EVP_MD_CTX* ctx = impl_->ctx;
  bool ok = EVP_DigestInit_ex2(ctx, impl_->md, nullptr) == 1 &&
            EVP_DigestUpdate(ctx, parent.bytes.data(), parent.bytes.size()) == 1 &&
            EVP_DigestUpdate(ctx, token_ids, num_tokens * sizeof(int32_t)) == 1;
  if (ok && !extra_keys.empty()) {
    const uint64_t len = extra_keys.size();
    ok = EVP_DigestUpdate(ctx, &len, sizeof(len)) == 1 &&
         EVP_DigestUpdate(ctx, extra_keys.data(), extra_keys.size()) == 1;
  }
  BlockHash out;
  unsigned int out_len = 0;
  ok = ok && EVP_DigestFinal_ex(ctx, out.bytes.data(), &out_len) == 1;
  CORELLM_CHECK(ok && out_len == out.bytes.size(), "SHA-256 digest failed");
  return out;
}

}  // namespace corellm
