"""Stand-in for @rules_cc: Bazel 4.2.3's own native C++ rules, re-exported.

Bazel's built-in rules ask for @rules_cc; Debian ships a rules_cc too new for Bazel 4, and
the build has no network, so this tiny repository answers instead.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
