//! Integration tests live in `all/` (one binary: each test binary links LLVM).
