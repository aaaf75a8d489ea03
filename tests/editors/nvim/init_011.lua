-- Neovim 0.11+: the README's configuration (vim.lsp.config + vim.lsp.enable); Neovim answers
-- workspace/configuration from `settings` and pulls diagnostics.
-- Usage: TORCHLS_CMD='["torchls", "server"]' nvim --headless -u init_011.lua train.py
local here = vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":p:h")

vim.lsp.config("torchls", {
  cmd = vim.json.decode(vim.env.TORCHLS_CMD),
  filetypes = { "python" },
  root_markers = { "pyproject.toml", "setup.py", "setup.cfg", ".git" },
  settings = { torchls = { run = "onType", ignore = { "TL303" } } },
})
vim.lsp.enable("torchls")

dofile(here .. "/driver.lua")
