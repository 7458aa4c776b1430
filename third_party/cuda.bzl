# CUDA for Bazel 4.2.3, which has no CUDA rules: each .cu file is compiled to an object with
# nvcc from /usr/local/cuda (g++-12 as host compiler) and wrapped in a cc_library, so the rest
# of the build links it like any C++ library. Targets made here are tagged "manual": they are
# built only when something depends on them, which the project does only through
# select("//third_party:cuda_enabled") (bazel build --config=cuda). The default build never
# runs nvcc.

NVCC = "/usr/local/cuda/bin/nvcc"

# Host-compiler and optimisation flags; the GPU architectures come from
# --define=spex_cuda_archs=80,90 (set by --config=cuda in .bazelrc) as
# `-gencode arch=compute_XY,code=sm_XY` each: SASS only, which a GPU runs when its major
# version matches and its minor is >= the arch's.
NVCC_FLAGS = [
    "-ccbin",
    "/usr/bin/g++-12",
    "-std=c++17",
    "-O2",
    "-Xcompiler",
    "-fPIC",
    "-Xcompiler",
    "-Wall",
    "--expt-relaxed-constexpr",
]

def _arch_flags(ctx):
    archs = ctx.var.get("spex_cuda_archs", "")
    if not archs:
        fail("CUDA targets need --define=spex_cuda_archs=80,90 (use --config=cuda)")
    flags = []
    for arch in archs.split(","):
        if not arch.isdigit() or int(arch) < 75:
            fail("spex_cuda_archs: '%s' is not an architecture nvcc 13 builds for; " % arch +
                 "give numbers >= 75 such as 80,90 (never 'native': there is no GPU at build time)")
        flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch)]
    return flags

def _cuda_objects_impl(ctx):
    cc_infos = [dep[CcInfo] for dep in ctx.attr.deps if CcInfo in dep]
    headers = depset(
        ctx.files.hdrs,
        transitive = [info.compilation_context.headers for info in cc_infos],
    )
    include_flags = ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    for info in cc_infos:
        cc = info.compilation_context
        include_flags += ["-I" + d for d in cc.includes.to_list()]
        include_flags += ["-I" + d for d in cc.quote_includes.to_list()]
        include_flags += ["-isystem" + d for d in cc.system_includes.to_list()]
        include_flags += ["-D" + d for d in cc.defines.to_list()]

    outputs = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(src.extension) - 1]
        obj = ctx.actions.declare_file("%s/%s.o" % (ctx.label.name, stem))
        ctx.actions.run(
            executable = NVCC,
            arguments = NVCC_FLAGS + _arch_flags(ctx) + ctx.attr.copts + include_flags +
                        ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            env = {"PATH": "/usr/local/cuda/bin:/usr/bin:/bin", "TMPDIR": "/tmp"},
        )

        outputs.append(obj)
    return [DefaultInfo(files = depset(outputs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc; linked with cudart and NCCL.

    Tagged manual: reach it only through select("//third_party:cuda_enabled").
    `deps` are C++ libraries whose headers the .cu files include (and which are linked).
    """
    _cuda_objects(
        name = name + "_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        tags = ["manual"],
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_objects"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        tags = ["manual"],
        visibility = visibility,
        **kwargs
    )
