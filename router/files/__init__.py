"""The Files API: uploads kept in a store, owned by the key that sent them, expired on a schedule."""
