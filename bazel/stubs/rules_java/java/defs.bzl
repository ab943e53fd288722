"""Stand-in for @rules_java: Bazel 4.2.3's native Java rules, re-exported (see rules_cc)."""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_test = native.java_test
java_toolchain = native.java_toolchain
java_runtime = native.java_runtime
java_plugin = native.java_plugin
java_package_configuration = native.java_package_configuration
