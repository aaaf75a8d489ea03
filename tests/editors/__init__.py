"""End-to-end tests with real editor clients (Neovim) and editor-like LSP clients (Helix)."""
