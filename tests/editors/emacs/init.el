;;; init.el --- the README's eglot configuration for torchls -*- lexical-binding: t -*-

;; What a user puts in their init file (README, "Emacs"); the test gives the server command in
;; $TORCHLS_CMD (a JSON list) instead of `("torchls" "server")', so that the checkout's torchls
;; runs. Settings come from the project's .dir-locals.el, which the test writes.

(require 'json)

(with-eval-after-load 'eglot
  (add-to-list 'eglot-server-programs
               `((python-mode python-ts-mode)
                 . ,(append (json-read-from-string (getenv "TORCHLS_CMD")) nil))))
(add-hook 'python-mode-hook #'eglot-ensure)

;;; init.el ends here
