// Version numbers shared by every binary. kProtocolVersion changes whenever
// the wire schema in proto/dslaunch.proto changes incompatibly.
#pragma once

namespace dslaunch {

inline constexpr unsigned kProtocolVersion = 2;
inline constexpr const char* kVersion = "0.1.0";

}  // namespace dslaunch
