#include "proto/auth.h"

// SHA256_Init/Update/Final: deprecated in OpenSSL 3, see HmacSha256.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <fcntl.h>           // open
#include <openssl/crypto.h>  // CRYPTO_memcmp, OPENSSL_cleanse
#include <openssl/sha.h>     // SHA256_*
#include <sys/random.h>      // getrandom
#include <sys/stat.h>        // fstat
#include <unistd.h>          // read

#include <algorithm>
#include <array>
#include <cctype>  // isspace
#include <cerrno>
#include <cmath>    // log2
#include <cstdio>   // snprintf
#include <cstring>  // memcpy

#include "base/status.h"

namespace dslaunch::proto {

// The kernel's generator, as OpenSSL's own is seeded from: RAND_bytes' first
// call costs about 1.5 ms of setup, on the launch path of every process.
std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    DSL_CHECK(r > 0);
    got += static_cast<size_t>(r);
  }
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

// HMAC (RFC 2104) over OpenSSL's SHA-256 block function. OpenSSL's own
// HMAC() first fetches the algorithm from its provider (about 0.9 ms on the
// first call, on every agent's launch path); SHA256_Init and friends are
// deprecated in OpenSSL 3 but compute the same digest in microseconds.
// Checked against RFC 4231's test vectors and OpenSSL's HMAC() in
// tests/proto/auth_test.cc.
std::string HmacSha256(std::string_view key, std::string_view data) {
  constexpr size_t kBlock = 64;
  unsigned char k0[kBlock] = {0};
  if (key.size() > kBlock) {
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), k0);
  } else {
    std::memcpy(k0, key.data(), key.size());
  }
  unsigned char pad[kBlock];
  unsigned char inner[SHA256_DIGEST_LENGTH];
  unsigned char outer[SHA256_DIGEST_LENGTH];
  SHA256_CTX ctx;
  for (size_t i = 0; i < kBlock; ++i) pad[i] = k0[i] ^ 0x36;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, pad, kBlock);
  SHA256_Update(&ctx, data.data(), data.size());
  SHA256_Final(inner, &ctx);
  for (size_t i = 0; i < kBlock; ++i) pad[i] = k0[i] ^ 0x5c;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, pad, kBlock);
  SHA256_Update(&ctx, inner, sizeof(inner));
  SHA256_Final(outer, &ctx);
  OPENSSL_cleanse(k0, sizeof(k0));
  OPENSSL_cleanse(pad, sizeof(pad));
  OPENSSL_cleanse(&ctx, sizeof(ctx));
  return std::string(reinterpret_cast<char*>(outer), sizeof(outer));
}

StatusOr<std::string> ReadSecretFile(const std::string& path) {
  // Non-blocking: a FIFO without a writer must not hang us; only a regular
  // file is taken.
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus("--secret_file " + path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("--secret_file " + path + ": not a regular file");
  }
  std::string text(4097, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd, text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus("--secret_file " + path, err);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  text.resize(got);
  if (got > 4096)
    return InvalidArgument("--secret_file " + path +
                           ": longer than 4096 bytes");
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.pop_back();
  for (unsigned char c : text) {
    if (c <= ' ' || c == 0x7f) {
      OPENSSL_cleanse(text.data(), text.size());
      return InvalidArgument("--secret_file " + path +
                             ": the secret has a space or control character "
                             "inside (one line expected)");
    }
  }
  if (text.size() < kMinSecretFileChars) {
    OPENSSL_cleanse(text.data(), text.size());
    return InvalidArgument(
        "--secret_file " + path + ": " +
        (text.empty() ? std::string("empty")
                      : "shorter than " + std::to_string(kMinSecretFileChars) +
                            " characters") +
        " (make one with: openssl rand -hex 32)");
  }
  return text;
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

namespace {

// The shortest p such that `s` is its first p characters repeated (cut).
size_t Period(std::string_view s) {
  for (size_t p = 1; p < s.size(); ++p) {
    size_t i = p;
    while (i < s.size() && s[i] == s[i - p]) ++i;
    if (i == s.size()) return p;
  }
  return s.size();
}

// The empirical Shannon entropy of `symbols` times their number, in bits.
double ShannonBits(std::string_view symbols) {
  std::array<size_t, 256> counts{};
  for (unsigned char c : symbols) ++counts[c];
  double bits = 0;
  for (size_t n : counts) {
    if (n == 0) continue;
    const double p =
        static_cast<double>(n) / static_cast<double>(symbols.size());
    bits -= static_cast<double>(n) * std::log2(p);
  }
  return bits;
}

// An estimate of the secret's entropy in bits over one period: the lesser
// of its characters' and of their successive differences' empirical
// Shannon entropy (the differences give away "abcdef..." and "0123...").
// An over-estimate for a phrase a person chose: it catches repetition,
// sequences and small alphabets, not words.
double EstimatedBits(std::string_view secret) {
  const std::string_view unit = secret.substr(0, Period(secret));
  std::string steps;
  for (size_t i = 1; i < unit.size(); ++i)
    steps.push_back(static_cast<char>(unit[i] - unit[i - 1]));
  return std::min(ShannonBits(unit), ShannonBits(steps));
}

}  // namespace

std::vector<std::string> SecretFileWarnings(const std::string& path,
                                            std::string_view secret) {
  std::vector<std::string> warnings;
  struct stat st {};
  const bool stated = ::stat(path.c_str(), &st) == 0;
  if (stated && st.st_uid != ::geteuid() && st.st_uid != 0) {
    warnings.push_back("--secret_file " + path + " belongs to user " +
                       std::to_string(st.st_uid) +
                       ", who can read it and change it");
  }
  // Group-readable is not warned about: a Kubernetes Secret volume is
  // root's, readable by the pod's fsGroup (defaultMode 0440).
  if (stated && (st.st_mode & S_IROTH)) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o",
                  static_cast<unsigned>(st.st_mode & 07777));
    warnings.push_back("--secret_file " + path +
                       " is readable by every user of this machine (mode " +
                       mode +
                       "): anyone who reads it can join the job; chmod o-r "
                       "it (a Kubernetes Secret: defaultMode 0440 or 0400)");
  }
  constexpr double kMinBits = 80;  // random hex of 16 bytes: 95 or more
  const double bits = EstimatedBits(secret);
  if (bits < kMinBits) {
    warnings.push_back(
        "--secret_file " + path + ": the secret looks guessable (" +
        std::to_string(static_cast<int>(bits)) + " bits of entropy at most, " +
        std::to_string(static_cast<int>(kMinBits)) +
        " wanted); make one with: openssl rand -hex 32");
  }
  return warnings;
}

}  // namespace dslaunch::proto
