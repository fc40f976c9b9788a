// Drives `sandboxctl mcp` with the official MCP TypeScript SDK (v2, `@modelcontextprotocol/client`),
// unmodified, with version negotiation on (`mode: 'auto'`: `server/discover`, then 2026-07-28).
// Each tool is called once, in order, each call naming the sandbox an earlier one returned.
// Prints one JSON object: the negotiated protocol version and every call with its result.
//
//   node drive.mjs stdio COMMAND [ARG...]     (the server's environment is this process's)
//   node drive.mjs http URL
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const [kind, target, ...rest] = process.argv.slice(2);
const transport =
    kind === 'stdio'
        ? new StdioClientTransport({ command: target, args: rest, env: process.env, stderr: 'inherit' })
        : new StreamableHTTPClientTransport(new URL(target));
const client = new Client({ name: 'sandboxd-mcp-js-test', version: '0' }, { versionNegotiation: { mode: 'auto' } });
await client.connect(transport);

const calls = [];
async function call(name, args) {
    const result = await client.callTool({ name, arguments: args });
    calls.push({ name, arguments: args, isError: result.isError ?? false, structured: result.structuredContent ?? null });
    return result.structuredContent ?? {};
}

const { sandbox } = await call('create_sandbox', {});
await call('write_file', { sandbox, path: 'src/app.py', content: 'print(6*7)\n' });
await call('run_command', { sandbox, command: 'python3 src/app.py' });
await call('read_file', { sandbox, path: 'src/app.py' });
await call('list_files', { sandbox });
await call('kill_sandbox', { sandbox });
await call('run_command', { sandbox, command: 'true' });
await call('create_sandbox', {});

const protocol = client.getNegotiatedProtocolVersion();
await client.close();
process.stdout.write(JSON.stringify({ protocol, calls }) + '\n');
