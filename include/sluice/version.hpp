// SPDX-License-Identifier: Apache-2.0
// sluice/version.hpp — the release this library is: the one place the version is written (the
// top CMakeLists.txt reads it from here for the package, sluiced and the sluice CLI).
//
//   std::printf("built with sluice %s\n", sluice::version);
#pragma once

#define SLUICE_VERSION_STRING "0.1.0"

namespace sluice {

inline constexpr const char* version = SLUICE_VERSION_STRING;

}  // namespace sluice
