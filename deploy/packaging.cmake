# What `cmake --install` puts where, and the packages made from it: one
# layout, the build tree's, under every prefix (bin/ for the programs,
# lib/dslaunch/ for the CUDA engine, share/dslaunch/python for the Python
# files), because dsagent and dsworker find those relative to themselves.
#
#   cmake --install build --prefix /opt/dslaunch   a plain install
#   cpack --config build/CPackConfig.cmake         dslaunch_0.1.0_amd64.deb (+ -cuda)
#   pip wheel . / python -m build --wheel          the wheel (pyproject.toml)
#
# In the wheel (SKBUILD) that layout sits inside the Python package:
# site-packages/dslaunch/{bin,lib,share}, so that auditwheel can vendor the
# shared libraries the programs need and give them an RPATH that holds
# wherever the venv is (a script directory has no fixed place relative to
# site-packages). The `dslaunch`, `dsagent` and `dsworker` commands a venv
# gets exec the programs there (python/dslaunch/_exec.py); dslaunch starts
# the dsagent next to itself, so agents never go through Python.
if(SKBUILD)
  set(dsl_root dslaunch/)
else()
  set(dsl_root "")
endif()

install(TARGETS dslaunch dsagent dsworker RUNTIME DESTINATION ${dsl_root}bin
        COMPONENT dslaunch)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/
        DESTINATION ${dsl_root}share/dslaunch/python COMPONENT dslaunch
        PATTERN __pycache__ EXCLUDE)
if(DSL_WITH_CUDA)
  install(TARGETS dsl_cuda LIBRARY DESTINATION ${dsl_root}lib/dslaunch
          COMPONENT cuda)
endif()
if(NOT SKBUILD)
  install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/LICENSE
          DESTINATION share/doc/dslaunch COMPONENT dslaunch)
endif()

# ---- The Debian package: dslaunch (the programs and Python files; its
# Depends from dpkg-shlibdeps) and, where the CUDA engine was built,
# dslaunch-cuda (libdsl_cuda.so; it needs CUDA 13's cuBLAS, which Debian
# does not package: NVIDIA's libcublas-13-0 or a CUDA toolkit).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dslaunch)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "dslaunch developers <dslaunch@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "job launcher for multi-node deep-learning training")
set(CPACK_PACKAGE_DESCRIPTION
    "dslaunch starts one dsagent per node (over SSH, pdsh, SLURM, mpirun or
in pods), which runs one rank per GPU with the torchrun, DeepSpeed and
Horovod environment, streams logs and progress back and tears the whole job
down together when anything fails. dsworker is its own GPT training engine
(ZeRO stages 0-3).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_DSLAUNCH_PACKAGE_NAME dslaunch)
set(CPACK_DEBIAN_DSLAUNCH_PACKAGE_SHLIBDEPS ON)
# Python ranks get the client and the progress hook; python3 runs them.
set(CPACK_DEBIAN_DSLAUNCH_PACKAGE_RECOMMENDS "python3, openssh-client")
set(CPACK_DEBIAN_CUDA_PACKAGE_NAME dslaunch-cuda)
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "dslaunch (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_CUDA_PACKAGE_SUGGESTS "libcublas-13-0")
set(CPACK_COMPONENT_CUDA_DESCRIPTION
    "dsworker's CUDA engine (libdsl_cuda.so), loaded when a run uses a GPU")
if(DSL_WITH_CUDA)
  set(CPACK_COMPONENTS_ALL dslaunch cuda)
else()
  set(CPACK_COMPONENTS_ALL dslaunch)
endif()
include(CPack)
