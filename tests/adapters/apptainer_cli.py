"""The part of Apptainer's command line that Snakemake 9 uses, parsed: shared by the test STAND-IN
(tests/fakes/apptainer: records calls, runs them on the host) and the CI ADAPTER (tests/adapters/apptainer-over-bwrap:
runs them in the built image).

    apptainer --version
    apptainer [--quiet --silent] exec --home '<cwd>' <apptainer-args> [--bind <path>...] <image> <cmd...>
    apptainer pull --name <file> <uri>
"""
from __future__ import annotations

# exec options that take a value (the rest that start with '-' are flags such as --nv, --rocm, --cleanenv)
VALUE_OPTIONS = {"--bind", "-B", "--mount", "--home", "-H", "--pwd", "--env", "--env-file", "--overlay", "-o",
                 "--workdir", "-W", "--scratch", "-S", "--security", "--hostname", "--network", "--network-args",
                 "--apply-cgroups", "--fusemount", "--app", "--no-mount", "--cwd", "--dns", "--add-caps",
                 "--drop-caps", "--name"}
GLOBAL_FLAGS = {"--quiet", "-q", "--silent", "-s", "--debug", "-d", "--verbose", "-v", "--nocolor"}


class UsageError(SystemExit):
    pass


def split_global(argv: list[str]) -> tuple[list[str], list[str]]:
    """(global flags, the rest) of an apptainer command line."""
    flags = []
    argv = list(argv)
    while argv and argv[0] in GLOBAL_FLAGS:
        flags.append(argv.pop(0))
    return flags, argv


def parse_options(args: list[str]) -> tuple[list[list], list[str]]:
    """Leading options of a subcommand as [name, value-or-None] pairs, and the positional arguments after them."""
    opts: list[list] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, eq, value = args[i].partition("=")
        if eq:
            opts.append([name, value])
        elif name in VALUE_OPTIONS:
            if i + 1 >= len(args):
                raise UsageError(f"FATAL: option {name} needs a value")
            opts.append([name, args[i + 1]])
            i += 1
        else:
            opts.append([name, None])
        i += 1
    return opts, args[i:]


def parse_exec(args: list[str]) -> dict:
    opts, rest = parse_options(args)
    if not rest:
        raise UsageError("FATAL: exec needs an image and a command")
    image, command = rest[0], rest[1:]
    binds = [p for name, v in opts if name in ("--bind", "-B") for p in v.split(",")]
    return {"image": image, "command": command, "options": opts, "binds": binds,
            "flags": [name for name, v in opts if v is None],
            "home": next((v for name, v in opts if name in ("--home", "-H")), None),
            "pwd": next((v for name, v in opts if name in ("--pwd", "--cwd")), None),
            "env": [v for name, v in opts if name == "--env"]}
