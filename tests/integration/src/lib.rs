//! Test support for end-to-end tests: start real binaries, talk HTTP.
