#include "proto/auth.h"

#include <openssl/crypto.h>  // CRYPTO_memcmp
#include <openssl/evp.h>     // EVP_sha256
#include <openssl/hmac.h>    // HMAC
#include <openssl/rand.h>    // RAND_bytes

#include "proto/status.h"

namespace dslaunch::proto {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  DSL_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()),
                       static_cast<int>(n)) == 1);
  return out;
}

std::string HexEncode(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  DSL_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                 reinterpret_cast<const unsigned char*>(data.data()),
                 data.size(), md, &md_len) != nullptr);
  return std::string(reinterpret_cast<char*>(md), md_len);
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

static std::string Proof(std::string_view secret, std::string_view label,
                         std::string_view first, std::string_view second) {
  std::string data(label);
  data.push_back('\0');
  data.append(first);
  data.append(second);
  return HmacSha256(secret, data);
}

std::string LauncherProof(std::string_view secret,
                          std::string_view client_nonce,
                          std::string_view server_nonce) {
  return Proof(secret, "dslaunch-launcher", client_nonce, server_nonce);
}

std::string AgentProof(std::string_view secret, std::string_view client_nonce,
                       std::string_view server_nonce) {
  return Proof(secret, "dslaunch-agent", server_nonce, client_nonce);
}

}  // namespace dslaunch::proto
