// The node-web demo app: GET / and GET /health on $PORT (default 3000).
const http = require("http");
const port = Number(process.env.PORT || 3000);
http
  .createServer((req, res) => {
    const body = req.url === "/health" ? { status: "ok" } : { hello: "node-web", path: req.url, node: process.version };
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  })
  .listen(port, "0.0.0.0", () => console.log(`node-web listening on ${port}`));
