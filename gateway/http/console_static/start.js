// Wire the page: sign-in form, sign-out, the router; resume a session kept in this tab.
"use strict";

document.getElementById("signin").addEventListener("submit", async (e) => {
  e.preventDefault();
  const error = document.getElementById("signin-error");
  error.textContent = "";
  try {
    await signIn(document.getElementById("key").value.trim());
  } catch (err) {
    Console.key = null;
    error.textContent =
      err.status === 403
        ? "This is a tenant inference key: the console needs an admin or an auditor key."
        : err.message;
  }
});
document.getElementById("signout").addEventListener("click", signOut);
window.addEventListener("hashchange", () => Console.who && route());
if (Console.key) signIn(Console.key).catch(() => sessionStorage.removeItem("gw.key"));
