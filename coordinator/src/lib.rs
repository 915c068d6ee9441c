//! The coordinator: REST API over a store, placement and leases.
