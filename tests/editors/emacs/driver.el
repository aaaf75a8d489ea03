;;; driver.el --- eglot against torchls, headless, the way a user would drive it -*- lexical-binding: t -*-

;; Run by tests/editors/test_emacs.py as `emacs --batch -q -l init.el -l driver.el' in a project
;; holding train.py (static findings) and nan.py (a script whose repro finds a NaN). It opens
;; them, lets eglot 1.9 start torchls, and does what a user does: reads the diagnostics, opens
;; the code action menu (on a finding, and off one), shows a rule's documentation, applies a
;; fix, hovers, runs the bounded repro from the menu, and shuts the server down. What eglot saw
;; goes to $TORCHLS_REPORT as JSON; the Python test asserts on it.
;;
;; The menu is eglot's own `eglot-code-actions' with `completing-read' standing in for the
;; minibuffer: it records the titles and the default eglot offers, and answers as the user
;; would (a title, or Enter on the default). Waits are bounded so that a hang fails the run;
;; the bound is a safety net, never what the test checks.

(require 'cl-lib)
(require 'json)
(require 'eglot)

(defvar torchls-patience 120 "Seconds any single wait may take before the run fails.")
(defvar torchls-report nil "What eglot saw, as an alist, newest first.")
(defvar torchls-messages nil "Every window/showMessage, oldest first, as (TYPE MESSAGE).")

(defun torchls-note (key value)
  (push (cons key value) torchls-report))

(defun torchls-write-report (status)
  (torchls-note 'status status)
  (torchls-note 'messages (vconcat (mapcar (lambda (m) `((type . ,(car m)) (message . ,(cadr m))))
                                           torchls-messages)))
  (with-temp-file (getenv "TORCHLS_REPORT")
    (insert (json-encode torchls-report))))

;; Recorded before eglot's own handler shows it in the echo area.
(cl-defmethod eglot-handle-notification :before
  (_server (_method (eql window/showMessage)) &key type message)
  (setq torchls-messages (append torchls-messages (list (list type message)))))

(defun torchls-wait (what predicate)
  "Let Emacs process the server's messages until PREDICATE holds."
  (let ((deadline (+ (float-time) torchls-patience)))
    (while (not (funcall predicate))
      (when (> (float-time) deadline)
        (error "Gave up waiting for %s" what))
      (accept-process-output nil 0.05))))

(defun torchls-send-changes ()
  "Send the buffer's edits now. eglot sends them from an idle timer, and a batch Emacs is
never idle."
  (eglot--signal-textDocument/didChange))

(defun torchls-diagnostics ()
  "The current buffer's diagnostics as eglot handed them to Flymake."
  (mapcar
   (lambda (diag)
     (let ((lsp (cdr (assoc 'eglot-lsp-diag (flymake-diagnostic-data diag))))
           (beg (flymake-diagnostic-beg diag))
           (end (flymake-diagnostic-end diag)))
       `((code . ,(plist-get lsp :code))
         (source . ,(plist-get lsp :source))
         (severity . ,(plist-get lsp :severity))
         (text . ,(flymake-diagnostic-text diag))
         (line . ,(line-number-at-pos beg))
         ;; Characters from the start of the line: what Emacs positions are made of.
         (column . ,(save-excursion (goto-char beg) (- beg (line-beginning-position))))
         (end_column . ,(save-excursion (goto-char end) (- end (line-beginning-position)))))))
   eglot--diagnostics))

(defun torchls-has-code (code &optional source)
  (cl-some (lambda (d) (and (equal (alist-get 'code d) code)
                            (or (null source) (equal (alist-get 'source d) source))))
           (torchls-diagnostics)))

(defun torchls-menu (pick)
  "Open eglot's code action menu at point; PICK gets the titles and the default and returns
the title to choose (the default: the user pressed Enter). Returns what the menu showed."
  (let (shown
        ;; A key, not a mouse click: eglot then asks in the minibuffer instead of a popup.
        (last-nonmenu-event ?\r))
    (cl-letf (((symbol-function 'completing-read)
               (lambda (_prompt collection &optional _pred _match _initial _hist default &rest _)
                 (let ((titles (mapcar #'car collection)))
                   (setq shown `((titles . ,(vconcat titles)) (default . ,default)))
                   (funcall pick titles default)))))
      (condition-case failure
          (let* ((bounds (or (bounds-of-thing-at-point 'sexp) (cons (point) (point))))
                 (answer (eglot-code-actions (car bounds) (cdr bounds) nil t)))
            ;; A command's answer (the repro's `status'), when the action ran one.
            (when (and (consp answer) (keywordp (car answer)))
              (setq shown `((answer . ,(plist-get answer :status)) ,@shown))))
        (error (setq shown `((error . ,(error-message-string failure)) ,@shown)))))
    shown))

(defun torchls-pick (prefix)
  (lambda (titles _default) (cl-find-if (lambda (title) (string-prefix-p prefix title)) titles)))

(defun torchls-hover ()
  "The hover at point, formatted the way eglot formats it for display."
  (let ((hover (jsonrpc-request (eglot-current-server) :textDocument/hover
                                (eglot--TextDocumentPositionParams))))
    `((kind . ,(plist-get (plist-get hover :contents) :kind))
      (text . ,(eglot--hover-info (plist-get hover :contents) (plist-get hover :range))))))

(defun torchls-visit (file)
  "Visit FILE and wait until eglot manages it and published its first diagnostics."
  (find-file file)
  (unless (eglot-current-server)
    (apply #'eglot (eglot--guess-contact)))
  (torchls-wait (format "eglot to manage %s" file) #'eglot-current-server))

(defun torchls-drive ()
  ;; -- train.py: diagnostics, menus, documentation, a fix, a hover
  (torchls-visit "train.py")
  (let ((server (eglot-current-server)))
    (torchls-note 'capabilities (jsonrpc--json-encode (eglot-client-capabilities server)))
    (torchls-note 'server_pid (process-id (jsonrpc--process server))))
  (torchls-wait "TL101" (lambda () (torchls-has-code "TL101")))
  (torchls-note 'diagnostics (vconcat (torchls-diagnostics)))
  ;; Off any finding (an import line), Enter on whatever the menu offers.
  (goto-char (point-min))
  (search-forward "import torch.nn as nn")
  (backward-char 2)
  (let ((before (buffer-string)))
    (torchls-note 'menu_off_finding (torchls-menu (lambda (_titles default) default)))
    (torchls-note 'unchanged_after_enter_off_finding (equal before (buffer-string))))
  ;; On the finding: documentation first, then Enter on the default (the fix).
  (goto-char (point-min))
  (search-forward "criterion(probs")
  (backward-char 2)
  (torchls-note 'menu_on_finding (torchls-menu (torchls-pick "Show documentation for TL101")))
  (torchls-wait "the documentation" (lambda () (cl-some (lambda (m) (string-match-p "What it catches" (cadr m)))
                                                        torchls-messages)))
  (torchls-menu (lambda (_titles default) default))
  (torchls-send-changes)
  (torchls-note 'fixed_line (buffer-substring-no-properties (line-beginning-position)
                                                            (line-end-position)))
  (torchls-wait "TL101 to go" (lambda () (not (torchls-has-code "TL101"))))
  (torchls-note 'diagnostics_after_fix (vconcat (torchls-diagnostics)))
  (goto-char (point-min))
  (search-forward "criterion(logits")
  (goto-char (+ (match-beginning 0) 2))
  (torchls-note 'hover (torchls-hover))
  ;; -- nan.py: the repro from the menu, without blocking
  (torchls-visit "nan.py")
  (goto-char (point-min))
  (search-forward "opt.zero_grad()")
  (backward-char 3)
  (let ((menu (torchls-menu (torchls-pick "Run bounded repro"))))
    ;; The menu returned: eglot's request is answered. Have the run's results come already?
    (torchls-note 'menu_repro menu)
    (torchls-note 'probe_findings_when_the_command_returned (torchls-has-code "TL901" "torchls-probe")))
  (torchls-wait "TL901 from the repro" (lambda () (torchls-has-code "TL901" "torchls-probe")))
  (torchls-note 'probe_diagnostics
                (vconcat (cl-remove-if-not (lambda (d) (equal (alist-get 'source d) "torchls-probe"))
                                           (torchls-diagnostics))))
  (torchls-wait "the repro's summary" (lambda () (cl-some (lambda (m) (string-match-p "repro of nan.py:" (cadr m)))
                                                          torchls-messages)))
  (goto-char (point-min))
  (search-forward "tag")
  (torchls-note 'trace_hover (torchls-hover))
  ;; -- shutdown: eglot waits 1.5 s for the answer, then kills the server either way
  (let* ((server (eglot-current-server))
         (process (jsonrpc--process server)))
    (condition-case failure
        (progn (eglot-shutdown server)
               (torchls-note 'shutdown "answered"))
      (error (torchls-note 'shutdown (format "failed: %s" (error-message-string failure)))))
    (torchls-note 'server_status_after_shutdown (symbol-name (process-status process)))))

(condition-case failure
    (progn
      (torchls-drive)
      (torchls-write-report "ok"))
  (error
   (torchls-note 'error (error-message-string failure))
   (torchls-write-report "failed")))
(kill-emacs 0)

;;; driver.el ends here
