"""The `dslaunch`, `dsagent` and `dsworker` commands of an installed wheel:
each replaces itself (exec, same pid) with the program of that name in the
wheel's dslaunch/bin/ (deploy/packaging.cmake). dslaunch then starts the
dsagent next to itself on every node, without going through Python again.
The programs are found through the installed distribution, not this file:
in a rank, dslaunch's own copy of this package comes first on PYTHONPATH."""
import os
import sys


def _exec(name):
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        path = str(distribution("dslaunch").locate_file(os.path.join("dslaunch", "bin", name)))
    except PackageNotFoundError:
        sys.stderr.write("%s: the dslaunch wheel is not installed here\n" % name)
        sys.exit(127)
    try:
        os.execv(path, [path] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write("%s: cannot run %s: %s (is the dslaunch wheel whole?)\n"
                         % (name, path, e.strerror))
        sys.exit(127)


def dslaunch():
    _exec("dslaunch")


def dsagent():
    _exec("dsagent")


def dsworker():
    _exec("dsworker")
