// Mutual authentication with a per-job secret. The launcher generates the
// secret; each side proves knowledge of it with an HMAC over both nonces and
// a direction label, so neither proof can be replayed as the other. Pure
// functions; any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dslaunch::proto {

inline constexpr size_t kSecretBytes = 32;
inline constexpr size_t kNonceBytes = 32;

// Cryptographically random bytes (the kernel's getrandom); aborts on
// failure.
std::string RandomBytes(size_t n);
std::string HexEncode(std::string_view bytes);
std::string HmacSha256(std::string_view key, std::string_view data);
bool ConstantTimeEqual(std::string_view a, std::string_view b);

// The job secret in `path` (--secret_file, --launcher join): its text up to
// trailing whitespace, at least kMinSecretFileChars characters with no
// whitespace or control characters inside, at most 4096. Errors name the
// file: NotFound/PermissionDenied as the OS says, InvalidArgument otherwise.
inline constexpr size_t kMinSecretFileChars = 32;
StatusOr<std::string> ReadSecretFile(const std::string& path);

// What is wrong with a secret file that still works: readable by every
// user of the machine (mode o+r), or a secret that looks guessable (little
// entropy in its characters, or one short pattern repeated, e.g. 32 equal
// characters). One sentence each, naming the file; empty when none.
std::vector<std::string> SecretFileWarnings(const std::string& path,
                                            std::string_view secret);

std::string LauncherProof(std::string_view secret,
                          std::string_view client_nonce,
                          std::string_view server_nonce);
std::string AgentProof(std::string_view secret, std::string_view client_nonce,
                       std::string_view server_nonce);

}  // namespace dslaunch::proto
