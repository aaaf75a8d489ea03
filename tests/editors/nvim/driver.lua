-- The end-to-end script both Neovim versions run once torchls is configured (init_07.lua,
-- init_011.lua): it waits for diagnostics, picks code actions through Neovim's own
-- vim.lsp.buf.code_action() (vim.ui.select answered by the script), hovers with
-- vim.lsp.buf.hover() and writes what a user would have seen as JSON to $TORCHLS_REPORT.
-- Every wait is for a condition; WAIT_MS only stops a hung run.
local WAIT_MS = 30000
local report = { steps = {}, nvim = tostring(vim.version().major) .. "." .. tostring(vim.version().minor) }
local python_buf
vim.o.hidden = true

local function finish(status)
  report.status = status
  vim.fn.writefile({ vim.fn.json_encode(report) }, vim.env.TORCHLS_REPORT)
  vim.cmd("qall!")
end

local function wait_for(step, condition)
  table.insert(report.steps, step)
  if not vim.wait(WAIT_MS, condition, 10) then
    error("timed out waiting for: " .. step, 0)
  end
end

local function torchls_client()
  if vim.lsp.get_clients then
    return vim.lsp.get_clients({ bufnr = python_buf, name = "torchls" })[1]
  end
  for _, client in pairs(vim.lsp.buf_get_clients(python_buf)) do
    if client.name == "torchls" then
      return client
    end
  end
end

local function diagnostics()
  local out = {}
  for _, d in ipairs(vim.diagnostic.get(python_buf)) do
    local lsp = d.user_data and d.user_data.lsp or {}
    table.insert(out, {
      code = d.code or lsp.code,
      source = d.source,
      severity = d.severity,
      lnum = d.lnum,
      col = d.col,
      end_col = d.end_col,
      message = d.message,
    })
  end
  return out
end

local function codes()
  local out = {}
  for _, d in ipairs(diagnostics()) do
    out[d.code] = true
  end
  return out
end

local function line_of(text)
  for index, line in ipairs(vim.api.nvim_buf_get_lines(python_buf, 0, -1, false)) do
    local col = line:find(text, 1, true)
    if col then
      return index, col - 1
    end
  end
  error("not in the buffer: " .. text, 0)
end

-- Answers the next vim.ui.select of code actions with the one whose title starts with `prefix`.
local function pick_code_action(prefix, into)
  vim.ui.select = function(items, opts, on_choice)
    local chosen
    into.titles = {}
    for _, item in ipairs(items) do
      local title = opts.format_item and opts.format_item(item) or tostring(item)
      table.insert(into.titles, title)
      if chosen == nil and title:sub(1, #prefix) == prefix then
        chosen = item
      end
    end
    into.picked = chosen ~= nil
    on_choice(chosen)
  end
  vim.lsp.buf.code_action()
  wait_for("code action menu for " .. prefix, function()
    return into.picked ~= nil
  end)
end

local function floating_lines()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= "" then
      return vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(win), 0, -1, false)
    end
  end
end

-- The result of workspace/executeCommand (the rule's Markdown), whichever path sent it.
local command_results = {}
vim.lsp.handlers["workspace/executeCommand"] = function(err, result)
  table.insert(command_results, err and { error = err.message } or { result = result })
end

local function run()
  python_buf = vim.api.nvim_get_current_buf()
  wait_for("torchls attached", function()
    return torchls_client() ~= nil and torchls_client().initialized ~= false
  end)
  local client = torchls_client()
  report.offset_encoding = client.offset_encoding
  report.pull_diagnostics = (client.server_capabilities or {}).diagnosticProvider ~= nil

  wait_for("diagnostics honouring the settings", function()
    local found = codes()
    return found.TL101 and not found.TL303
  end)
  report.diagnostics = diagnostics()

  -- "Show documentation for TL101": the command answers with the rule's Markdown and, in
  -- clients with window/showDocument, opens it.
  local row, col = line_of("probs, y")
  vim.api.nvim_win_set_cursor(0, { row, col })
  report.doc_action = {}
  pick_code_action("Show documentation for TL101", report.doc_action)
  wait_for("torchls.showRuleDoc answered", function()
    return #command_results > 0
  end)
  report.command = command_results[1]
  if vim.lsp.handlers["window/showDocument"] then
    wait_for("documentation buffer shown", function()
      return vim.api.nvim_buf_get_name(0):match("TL101%.md$") ~= nil
    end)
    report.doc_buffer = {
      name = vim.fn.fnamemodify(vim.api.nvim_buf_get_name(0), ":t"),
      first_line = vim.api.nvim_buf_get_lines(0, 0, 1, false)[1],
    }
    vim.api.nvim_set_current_buf(python_buf)
  end

  -- "Fix TL101": Neovim applies the edit, the server re-checks the changed text.
  row, col = line_of("probs, y")
  vim.api.nvim_win_set_cursor(0, { row, col })
  report.fix_action = {}
  pick_code_action("Fix TL101", report.fix_action)
  local function fixed_line()
    return vim.api.nvim_buf_get_lines(python_buf, row - 1, row, false)[1]
  end
  wait_for("the fix applied and TL101 gone", function()
    return fixed_line():find("logits, y", 1, true) ~= nil and not codes().TL101
  end)
  report.fixed_line = fixed_line()
  report.diagnostics_after_fix = diagnostics()

  -- Hover on the loss call: the contract shows in Neovim's floating window.
  row, col = line_of("criterion(logits")
  vim.api.nvim_win_set_cursor(0, { row, col + 2 })
  vim.lsp.buf.hover()
  wait_for("hover window", function()
    return floating_lines() ~= nil
  end)
  report.hover = floating_lines()
  finish("ok")
end

vim.api.nvim_create_autocmd("VimEnter", {
  callback = function()
    vim.schedule(function()
      local ok, problem = pcall(run)
      if not ok then
        report.error = tostring(problem)
        report.diagnostics_at_error = python_buf and diagnostics() or nil
        finish("failed")
      end
    end)
  end,
})
