// Smoke test of the npm `e2b` SDK against `scenario-run serve` (run by ../run.sh, which sets
// E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN and NODE_EXTRA_CA_CERTS). Exits
// non-zero on any failure.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'

const t0 = Date.now()
const sbx = await Sandbox.create({ metadata: { suite: 'e2b-js' }, envs: { FOO: 'bar' }, timeoutMs: 60_000 })
try {
  assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)

  const r = await sbx.commands.run('echo hi; echo err >&2; echo $FOO')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hi\nbar\n')
  assert.equal(r.stderr, 'err\n')

  await assert.rejects(sbx.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)

  await sbx.files.write('/home/user/js.txt', 'from node')
  assert.equal(await sbx.files.read('/home/user/js.txt'), 'from node')
  assert.equal((await sbx.commands.run('cat /home/user/js.txt')).stdout, 'from node')
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  assert.ok(names.includes('js.txt'), names.join(','))

  const info = await sbx.getInfo()
  assert.equal(info.metadata.suite, 'e2b-js')

  // serve secures every sandbox: a traffic token for ports, signed URLs for files.
  assert.match(sbx.trafficAccessToken, /^[0-9a-f]{64}$/)
  const signed = await sbx.downloadUrl('/home/user/js.txt')
  assert.match(signed, /signature=v1_/)
  const got = await fetch(signed)
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'from node')
  const unsigned = new URL(signed)
  unsigned.searchParams.delete('signature')
  assert.equal((await fetch(unsigned, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })).status, 401)

  // A server in the sandbox at https://{getHost(port)}, as the SDK builds it: *.localhost
  // resolves to loopback, and Node trusts serve's CA through NODE_EXTRA_CA_CERTS.
  await sbx.files.write('/home/user/www/index.html', 'node over tls')
  await sbx.commands.run('python3 -m http.server 8080 --bind 127.0.0.1', { cwd: '/home/user/www', background: true })
  const url = `https://${sbx.getHost(8080)}/index.html`
  const traffic = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
  let page
  for (let i = 0; i < 75; i++) {
    page = await fetch(url, { headers: traffic }).catch((e) => e)
    if (page.status === 200) break
    await new Promise((r) => setTimeout(r, 200))
  }
  assert.equal(page.status, 200, String(page.cause ?? page))
  assert.equal(await page.text(), 'node over tls')
  assert.equal((await fetch(url)).status, 403)
} finally {
  assert.equal(await sbx.kill(), true)
}
assert.equal(await sbx.isRunning(), false)
console.log(`js smoke: ok in ${Date.now() - t0} ms`)
