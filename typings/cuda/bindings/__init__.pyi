# Typing stubs for the parts of cuda-python (cuda-bindings >= 12.9.1) trtserve uses; see typings/README.md.
