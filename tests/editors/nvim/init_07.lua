-- Neovim 0.7 (Debian 12's): torchls started with vim.lsp.start_client in a FileType autocmd
-- (0.7 has neither vim.lsp.start nor vim.lsp.config). 0.7 neither announces
-- workspace/configuration nor sends `settings` by itself, so on_init pushes them with
-- workspace/didChangeConfiguration, as nvim-lspconfig does.
-- Usage: TORCHLS_CMD='["torchls", "server"]' nvim --headless -u init_07.lua train.py
local here = vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":p:h")

vim.api.nvim_create_autocmd("FileType", {
  pattern = "python",
  callback = function(args)
    local client_id = vim.lsp.start_client({
      name = "torchls",
      cmd = vim.fn.json_decode(vim.env.TORCHLS_CMD),
      root_dir = vim.fn.getcwd(),
      settings = { torchls = { run = "onType", ignore = { "TL303" } } },
      on_init = function(client)
        client.notify("workspace/didChangeConfiguration", { settings = client.config.settings })
      end,
    })
    vim.lsp.buf_attach_client(args.buf, client_id)
  end,
})

dofile(here .. "/driver.lua")
