// Turns a CUDA runtime error into a sentence an operator can act on ("no NVIDIA driver (or one
// older than the CUDA runtime): cudaErrorInsufficientDriver (CUDA driver version is ...)").
// Plain C++ on the error's name and text, so the wording is tested without CUDA; the callers
// pass cudaGetErrorName / cudaGetErrorString.
#pragma once

#include <string>

namespace spex {

// "<what it means>: <name> (<text>)"; unknown errors read "CUDA error: <name> (<text>)".
std::string ExplainCudaError(const std::string& name, const std::string& text);

}  // namespace spex
