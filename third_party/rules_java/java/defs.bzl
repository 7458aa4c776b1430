"""Stand-in for rules_java that Bazel 4.2.3 can load offline: re-exports the native rules."""
java_import = native.java_import
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
java_binary = native.java_binary
java_library = native.java_library
